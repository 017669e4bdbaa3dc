package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Event kinds a worker logs, one JSON object per line.
const (
	evStart       = "start"        // an incarnation started
	evGrant       = "grant"        // a lease was granted (Token, GrantedUS, ExpiryUS, TTLMS)
	evAcquireErr  = "acquire_err"  // an acquire failed (Err, Class)
	evRenewed     = "renewed"      // the worker saw a later expiry (ExpiryUS)
	evAck         = "ack"          // a fenced ledger write committed (WriteID, N, AtUS)
	evWriteLost   = "write_lost"   // RunInTx refused the write: lease lost (loss signal)
	evWriteErr    = "write_err"    // RunInTx failed otherwise (Err)
	evLost        = "lost"         // lease.Err() reported the lease lost (loss signal)
	evWindowEnded = "window_ended" // Remaining() was 0 before a step (loss signal)
	evHeld        = "held"         // the worker asked and the lease was still held (T: before it asked)
	evReleasing   = "releasing"    // Release is about to be called
	evReleased    = "released"     // Release returned (Class: ok, not_held, error)
	evProbe       = "probe"        // a liveness probe acquire (OK, WaitMS, Err)
	evIdle        = "idle"         // the churn loop stopped (quiesce)
)

// event is one line of a worker's log. Times: T is the local wall clock
// (Unix nanoseconds); *US fields are database time in Unix microseconds.
type event struct {
	T        int64  `json:"t"`
	Worker   string `json:"w"`
	Inc      int    `json:"inc"`
	Ev       string `json:"ev"`
	Locker   int    `json:"locker,omitempty"`
	Key      string `json:"key,omitempty"`
	Mode     string `json:"mode,omitempty"`
	Lease    string `json:"lease,omitempty"`
	Token    int64  `json:"token,omitempty"`
	TTLMS    int64  `json:"ttl_ms,omitempty"`
	Granted  int64  `json:"granted_us,omitempty"`
	Expiry   int64  `json:"expiry_us,omitempty"`
	WriteID  string `json:"write_id,omitempty"`
	N        int64  `json:"n,omitempty"`
	At       int64  `json:"at_us,omitempty"`
	WaitMS   int64  `json:"wait_ms,omitempty"`
	OK       bool   `json:"ok,omitempty"`
	Class    string `json:"class,omitempty"`
	Err      string `json:"err,omitempty"`
	Iso      string `json:"iso,omitempty"` // start: the session's default isolation (PostgreSQL)
	Phantom  bool   `json:"phantom,omitempty"`
	Unfenced bool   `json:"unfenced,omitempty"`
	Pause    bool   `json:"pause,omitempty"` // acquire_err: refused for the failover pause of a new primary
}

// eventLog appends events to a worker's JSON-lines file. Each event is one
// write(2) on an O_APPEND file, so a SIGKILL leaves whole lines only.
type eventLog struct {
	mu     sync.Mutex
	f      *os.File
	worker string
	inc    int
}

func openEventLog(path, worker string, inc int) (*eventLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &eventLog{f: f, worker: worker, inc: inc}, nil
}

// log writes e, stamped with the current time unless e.T is already set.
func (l *eventLog) log(e event) {
	if e.T == 0 {
		e.T = time.Now().UnixNano()
	}
	e.Worker, e.Inc = l.worker, l.inc
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *eventLog) close() error { return l.f.Close() }

// readEvents reads a worker log; it returns the events and how many lines
// could not be parsed (a torn last line).
func readEvents(path string) ([]event, int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var evs []event
	bad := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad++
			continue
		}
		evs = append(evs, e)
	}
	if err := sc.Err(); err != nil {
		return evs, bad, fmt.Errorf("read %s: %w", path, err)
	}
	return evs, bad, nil
}
