package caller

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
)

// appConns POSTs to the app over plain HTTP/1.1 keep-alive connections of
// its own, on the calling goroutine: the request is written and its answer
// read by the session worker itself. net/http's client hands every request
// to two goroutines of the connection (one writes, one reads) and back, and
// arms a timer and a context per request; at a steady stream of single
// events those hand-offs and wake-ups were a good part of the sidecar's CPU
// per event. It is used only for what it can do exactly as the default
// client would: an http:// app URL without user info or query, no proxy
// from the environment, and the default client (Options.HTTPClient unset).
// Plain answers are parsed in place, others by net/http (readAnswer).
type appConns struct {
	addr   string // host:port to dial
	host   string // the Host header
	prefix string // the URL's path, without a trailing slash
	dialer net.Dialer

	mu   sync.Mutex
	idle []*appConn
}

// maxIdleAppConns bounds the idle connections kept: one per concurrently
// delivering session, as the default client's MaxIdleConnsPerHost.
const maxIdleAppConns = 64

// appConn is one connection to the app.
type appConn struct {
	nc  net.Conn
	cr  countingReader
	br  *bufio.Reader
	buf []byte
	// offers is the header of the last plain answer (offerHeader).
	offers http.Header
}

// countingReader counts what was read from the connection since the last
// request was written: an answer that never began on a reused connection
// (the app closed it while idle) may be retried on a new one.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// newAppConns returns the direct client for the app at rawURL, or nil when
// the request must go through net/http (see appConns).
func newAppConns(rawURL string) *appConns {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Opaque != "" || u.Host == "" {
		return nil
	}
	if p, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil || p != nil {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	return &appConns{addr: addr, host: u.Host, prefix: strings.TrimSuffix(u.EscapedPath(), "/"),
		dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
}

// appResponse is what post reads of an answer.
type appResponse struct {
	status string
	code   int
	header http.Header
	msg    []byte // the first 512 bytes of the body
}

// errAppTimeout: no answer within the deadline (a refusal, as for a
// request whose context timed out).
var errAppTimeout = errors.New("the app did not answer in time")

// post sends body to path with headers h and reads the answer, within
// timeout. A connection the app had closed while idle is replaced once,
// as net/http retries a request with an Idempotency-Key.
func (a *appConns) post(path string, h http.Header, body []byte, timeout time.Duration) (appResponse, error) {
	deadline := time.Now().Add(timeout)
	for attempt := 0; ; attempt++ {
		c, reused, err := a.get(deadline)
		if err != nil {
			return appResponse{}, timeoutOr(err)
		}
		resp, err := c.roundTrip(a, path, h, body, deadline)
		if err == nil {
			return resp, nil
		}
		_ = c.nc.Close()
		if reused && attempt == 0 && c.cr.n == 0 && !isTimeout(err) {
			continue
		}
		return appResponse{}, timeoutOr(err)
	}
}

// get returns an idle connection or dials one.
func (a *appConns) get(deadline time.Time) (*appConn, bool, error) {
	a.mu.Lock()
	if n := len(a.idle); n > 0 {
		c := a.idle[n-1]
		a.idle[n-1] = nil
		a.idle = a.idle[:n-1]
		a.mu.Unlock()
		return c, true, nil
	}
	a.mu.Unlock()
	d := a.dialer
	d.Deadline = deadline
	nc, err := d.Dial("tcp", a.addr)
	if err != nil {
		return nil, false, err
	}
	c := &appConn{nc: nc}
	c.cr.r = nc
	c.br = bufio.NewReaderSize(&c.cr, 4096)
	return c, false, nil
}

// put keeps c for the next request, or closes it.
func (a *appConns) put(c *appConn) {
	_ = c.nc.SetDeadline(time.Time{})
	a.mu.Lock()
	if len(a.idle) < maxIdleAppConns {
		a.idle = append(a.idle, c)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	_ = c.nc.Close()
}

// roundTrip writes one request and reads its answer; on success c is back
// in the pool (or closed, if the answer says so).
func (c *appConn) roundTrip(a *appConns, path string, h http.Header, body []byte, deadline time.Time) (appResponse, error) {
	c.cr.n = 0
	if err := c.nc.SetDeadline(deadline); err != nil {
		return appResponse{}, err
	}
	buf, err := appendRequest(c.buf[:0], a.host, a.prefix+path, h, len(body))
	if err != nil {
		return appResponse{}, err
	}
	buf = append(buf, body...)
	if cap(buf) <= 64<<10 {
		c.buf = buf
	}
	if _, err := c.nc.Write(buf); err != nil {
		return appResponse{}, err
	}
	out, keep, err := c.readAnswer(c.br)
	if err != nil {
		return appResponse{}, err
	}
	if !keep {
		_ = c.nc.Close()
		return out, nil
	}
	a.put(c)
	return out, nil
}

// appendRequest appends a POST's request line and headers to b, with
// Content-Length n, as net/http writes them; header values with a line
// break or another control character are refused, as net/http refuses
// them.
func appendRequest(b []byte, host, target string, h http.Header, n int) ([]byte, error) {
	b = appendPostLine(b, host, target)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, "\r\n"...)
	for k, vs := range h {
		for _, v := range vs {
			if !validHeaderValue(v) {
				return b, fmt.Errorf("net/http: invalid header field value for %q", k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, strings.TrimSpace(v)...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...), nil
}

// appendPostLine appends a POST's request line and the Host and
// User-Agent headers net/http sends.
func appendPostLine(b []byte, host, target string) []byte {
	b = append(b, "POST "...)
	b = append(b, target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	return append(b, "\r\nUser-Agent: Go-http-client/1.1\r\n"...)
}

// validHeaderValue is httpguts.ValidHeaderFieldValue: no control
// characters but horizontal tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// timeoutOr turns a timeout into errAppTimeout (wrapping it).
func timeoutOr(err error) error {
	if isTimeout(err) {
		return timeoutErr(err)
	}
	return err
}

// timeoutErr is errAppTimeout, wrapping err if there is one.
func timeoutErr(err error) error {
	if err == nil {
		return errAppTimeout
	}
	return fmt.Errorf("%w: %w", errAppTimeout, err)
}

// streamConn is the body of a stream opened by appConns.openStream: each
// Write is one chunk, written at once on the connection by the caller (no
// pipe, no goroutine of a transport in between).
type streamConn struct {
	nc  net.Conn
	buf []byte
}

// Write sends p as one chunk of the request body.
func (c *streamConn) Write(p []byte) (int, error) {
	c.buf = strconv.AppendInt(c.buf[:0], int64(len(p)), 16)
	c.buf = append(c.buf, "\r\n"...)
	c.buf = append(c.buf, p...)
	c.buf = append(c.buf, "\r\n"...)
	_, err := c.nc.Write(c.buf)
	if cap(c.buf) > 1<<20 {
		c.buf = nil
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the request body (the last chunk); the app then ends its
// answer.
func (c *streamConn) Close() error {
	_, err := c.nc.Write([]byte("0\r\n\r\n"))
	return err
}

// CloseWithError breaks the stream: the connection is closed.
func (c *streamConn) CloseWithError(error) error { return c.nc.Close() }

// openStream opens a stream (POST StreamPath, a chunked body, Connection:
// close, as openHTTPStream sends it) on a connection of its own and reads
// the app's answer, within timeout (errAppTimeout past it). The answer's
// body is the app's ack lines; closing the connection ends both.
func (a *appConns) openStream(timeout time.Duration) (*streamConn, *http.Response, error) {
	deadline := time.Now().Add(timeout)
	d := a.dialer
	d.Deadline = deadline
	nc, err := d.Dial("tcp", a.addr)
	if err != nil {
		return nil, nil, timeoutOr(err)
	}
	c := &streamConn{nc: nc}
	b := appendPostLine(nil, a.host, a.prefix+StreamPath)
	b = append(b, "Connection: close\r\nContent-Type: "+server.ContentTypeNDJSON+"\r\nTransfer-Encoding: chunked\r\n\r\n"...)
	if err := nc.SetDeadline(deadline); err != nil {
		return c, nil, err
	}
	if _, err := nc.Write(b); err != nil {
		return c, nil, timeoutOr(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return c, nil, timeoutOr(err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		_ = resp.Body.Close()
		return c, nil, err
	}
	return c, resp, nil
}
