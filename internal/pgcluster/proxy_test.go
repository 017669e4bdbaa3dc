package pgcluster

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line, on 127.0.0.1.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		t.Fatalf("echo returned %q", line)
	}
	return time.Since(start), err
}

// TestProxy: the proxy forwards, delays while a spike is on, cuts open
// connections, and forwards again on a new connection after a cut.
func TestProxy(t *testing.T) {
	p, err := StartProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(t, c, r); err != nil {
		t.Fatalf("round trip through the proxy: %v", err)
	}
	p.SetDelay(150 * time.Millisecond)
	d, err := roundTrip(t, c, r)
	if err != nil || d < 300*time.Millisecond {
		t.Fatalf("with a 150ms delay each way: round trip %v, %v; want >= 300ms", d, err)
	}
	p.SetDelay(0)
	if n := p.Cut(); n != 1 {
		t.Errorf("Cut cut %d connections, want 1", n)
	}
	if _, err := roundTrip(t, c, r); err == nil {
		t.Fatal("a cut connection still answered")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := roundTrip(t, c2, bufio.NewReader(c2)); err != nil {
		t.Fatalf("new connection after a cut: %v", err)
	}
}

// TestProxyBlockAndRepoint: a blocked proxy closes new connections at once
// and forwards them again when unblocked; a re-pointed proxy sends new
// connections to the new upstream.
func TestProxyBlockAndRepoint(t *testing.T) {
	p, err := StartProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Block(true)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, bufio.NewReader(c)); err == nil {
		t.Fatal("a blocked proxy forwarded a new connection")
	}
	c.Close()
	p.Block(false)
	// Re-pointed at a closed port: new connections fail; back at an echo
	// server: they work.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p.SetUpstream(dead)
	c, err = net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, bufio.NewReader(c)); err == nil {
		t.Fatal("a proxy pointed at a closed port forwarded")
	}
	c.Close()
	p.SetUpstream(echoServer(t))
	c, err = net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(t, c, bufio.NewReader(c)); err != nil {
		t.Fatalf("after re-pointing: %v", err)
	}
}
