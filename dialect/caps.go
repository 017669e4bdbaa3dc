package dialect

import "fmt"

// derived are the capabilities a dialect gets from what it implements, not
// from what it declares.
const derived = CapNotify | CapFIFO

// CapabilitiesOf returns d's capabilities: the flags d.Capabilities
// declares, without CapNotify and CapFIFO, plus those two derived from what
// d implements: CapNotify when d implements Listener, CapFIFO when
// d.Statements().AcquireFIFO is set. The engine, the conformance suite and
// the CLI branch on it, never on d's name (SPEC W2, W6).
func CapabilitiesOf(d Dialect) Capabilities {
	c := d.Capabilities() &^ derived
	if _, ok := d.(Listener); ok {
		c |= CapNotify
	}
	if len(d.Statements().AcquireFIFO) > 0 {
		c |= CapFIFO
	}
	return c
}

// CheckConsistent reports a dialect whose parts contradict each other:
// AcquireFIFO without Dequeue (a FIFO waiter could not leave the queue),
// Dequeue or FastPath.ProbeFIFO without AcquireFIFO, or CapNotify or CapFIFO
// declared by Capabilities without what gives it (a Listener,
// AcquireFIFO). lock.New refuses such a dialect with this error, which
// names the dialect and what is missing.
func CheckConsistent(d Dialect) error {
	s := d.Statements()
	fifo := len(s.AcquireFIFO) > 0
	switch {
	case fifo && s.Dequeue == "":
		return fmt.Errorf("dialect %q has AcquireFIFO but no Dequeue statement: FIFO needs both (SPEC W6)", d.Name())
	case !fifo && (s.Dequeue != "" || FastPathOf(d).ProbeFIFO != ""):
		return fmt.Errorf("dialect %q has Dequeue or ProbeFIFO but no AcquireFIFO statement: set AcquireFIFO or neither (SPEC W6)", d.Name())
	}
	if extra := d.Capabilities() & derived &^ CapabilitiesOf(d); extra != 0 {
		return fmt.Errorf("dialect %q declares %s without implementing it: CapNotify comes from implementing dialect.Listener, CapFIFO from Statements.AcquireFIFO; do not declare them", d.Name(), extra)
	}
	return nil
}
