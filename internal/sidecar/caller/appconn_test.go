package caller

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAppConns: the direct client's requests as the app sees them, its
// answers, its connection reuse, an idle connection the app closed, a
// timeout, and the URLs it leaves to net/http.
func TestAppConns(t *testing.T) {
	var slow atomic.Bool
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/base"+EventsPath || r.Header.Get(HeaderSessionID) != "s1" ||
			r.Header.Get("Content-Type") != "application/json" || string(body) != `{"a":1}` || r.Host == "":
			http.Error(w, "unexpected request: "+r.Method+" "+r.URL.Path+" "+string(body), http.StatusBadRequest)
		case slow.Load():
			time.Sleep(300 * time.Millisecond)
		case r.Header.Get(HeaderSequence) == "big":
			w.Header().Set(HeaderBatchMax, "9")
			_, _ = w.Write([]byte(strings.Repeat("x", 100<<10)))
		default:
			w.Header().Set(HeaderBatchMax, "7")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer app.Close()
	a := newAppConns(app.URL + "/base/")
	if a == nil {
		t.Fatal("no direct client for " + app.URL)
	}
	h := func(seq string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, canonSessionID: {"s1"}, canonSequence: {seq}}
	}
	post := func(seq string, timeout time.Duration) (appResponse, error) {
		return a.post(EventsPath, h(seq), []byte(`{"a":1}`), timeout)
	}
	for i := range 3 {
		resp, err := post("1", 5*time.Second)
		if err != nil || resp.code != http.StatusOK || string(resp.msg) != "ok" || resp.header.Get(HeaderBatchMax) != "7" {
			t.Fatalf("request %d: %+v, %v", i, resp, err)
		}
	}
	if n := len(a.idle); n != 1 {
		t.Errorf("%d idle connections after 3 requests in a row, want 1 (reused)", n)
	}
	// The app closes the idle connection: the next request goes on a new one.
	app.CloseClientConnections()
	time.Sleep(50 * time.Millisecond)
	if resp, err := post("2", 5*time.Second); err != nil || resp.code != http.StatusOK {
		t.Fatalf("after the app closed the idle connection: %+v, %v", resp, err)
	}
	// A long answer is read up to its first 512 bytes, and the connection
	// is not kept.
	resp, err := post("big", 5*time.Second)
	if err != nil || resp.code != http.StatusOK || len(resp.msg) != 512 || resp.header.Get(HeaderBatchMax) != "9" {
		t.Fatalf("a long answer: %d bytes, %v", len(resp.msg), err)
	}
	if n := len(a.idle); n != 0 {
		t.Errorf("%d idle connections after a long answer, want 0", n)
	}
	// No answer in time: errAppTimeout (a refusal for post).
	slow.Store(true)
	if _, err := post("3", 100*time.Millisecond); !errors.Is(err, errAppTimeout) {
		t.Errorf("a slow app: %v, want errAppTimeout", err)
	}
	slow.Store(false)
	if resp, err := post("4", 5*time.Second); err != nil || resp.code != http.StatusOK {
		t.Fatalf("after a timeout: %+v, %v", resp, err)
	}
	// A header value with a line break is refused, not sent.
	bad := h("5")
	bad.Set("Tracestate", "a=b\r\nX-Evil: 1")
	if _, err := a.post(EventsPath, bad, nil, time.Second); err == nil {
		t.Error("a header value with CRLF was sent")
	}
	// What is left to net/http.
	for _, u := range []string{"https://127.0.0.1:1", "http://u:p@127.0.0.1:1", "http://127.0.0.1:1/?q=1", "unix:///x"} {
		if newAppConns(u) != nil {
			t.Errorf("a direct client for %s", u)
		}
	}
}
