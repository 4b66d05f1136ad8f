package transporttest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target and can hold back the bytes
// flowing from the target to the client (Pause: confirms and deliveries stop
// arriving while publishes still go out), cut every connection (Cut: a
// network failure, not a clean AMQP close), or refuse new ones (Down).
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	paused  bool
	resumed *sync.Cond
	down    bool
	wg      sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 and forwards to target until tb ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.resumed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pause holds back target→client bytes until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume releases target→client bytes.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.resumed.Broadcast()
	p.mu.Unlock()
}

// Cut closes every proxied connection abruptly.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Down makes the proxy refuse connections (down=true) or accept them again.
func (p *Proxy) Down(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Resume()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[u] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c, false)
		go p.pipe(c, u, true)
	}
}

// pipe copies from src to dst; downstream copies honour Pause.
func (p *Proxy) pipe(dst, src net.Conn, downstream bool) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if downstream {
				p.mu.Lock()
				for p.paused {
					p.resumed.Wait()
				}
				p.mu.Unlock()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close both sides
		}
	}
}
