package pgcluster

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of a server: it can delay
// every forwarded chunk (a latency spike), cut every open connection,
// refuse new ones (a partition) and be re-pointed at another server (a
// failover behind a fixed address). Its methods are safe for concurrent
// use.
type Proxy struct {
	ln       net.Listener
	delay    atomic.Int64 // nanoseconds added before forwarding each chunk
	mu       sync.Mutex
	upstream string
	blocked  bool
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// StartProxy listens on a free port of 127.0.0.1 and forwards each
// connection to upstream (host:port).
func StartProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetUpstream makes new connections go to upstream (host:port); open ones
// stay where they are (Cut them to move every client).
func (p *Proxy) SetUpstream(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
}

// Block makes the proxy close every new connection at once (true) or
// forward them again (false); open ones are not touched (see Cut).
func (p *Proxy) Block(blocked bool) {
	p.mu.Lock()
	p.blocked = blocked
	p.mu.Unlock()
}

// target returns where a new connection goes, or "" while blocked.
func (p *Proxy) target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked {
		return ""
	}
	return p.upstream
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			target := p.target()
			if target == "" {
				_ = c.Close()
				return
			}
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = c.Close()
				return
			}
			if !p.track(c) || !p.track(up) {
				p.untrack(c)
				p.untrack(up)
				return
			}
			var once sync.Once
			done := func() { once.Do(func() { p.untrack(c); p.untrack(up) }) }
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pipe(up, c)
				done()
			}()
			p.pipe(c, up)
			done()
		}()
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection
		}
	}
}

// SetDelay sets the latency added to every forwarded chunk (0: none).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Cut closes every open connection; new ones are accepted as before. It
// returns how many client connections were cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return len(cs) / 2
}

// Close stops accepting, cuts every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
}
