package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

func TestProbes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_total", Help: "h"})
	reg.MustRegister(c)
	c.Inc()
	var ready Readiness
	var amqp Flag
	ready.Add("amqp", amqp.Err)
	srv := httptest.NewServer(ProbeHandler(&ready, reg))
	defer srv.Close()

	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, `"amqp":"not started"`) {
		t.Fatalf("/readyz before = %d %s", code, body)
	}
	amqp.Set(errors.New("connection refused"))
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "connection refused") {
		t.Fatalf("/readyz failing = %d %s", code, body)
	}
	amqp.Set(nil)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz ready = %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "test_total 1") {
		t.Fatalf("/metrics = %d %s", code, body)
	}
}

func TestDecodeJSON(t *testing.T) {
	for _, tc := range []struct {
		name, ct, body string
		allowEmpty     bool
		status         int
	}{
		{"ok", "application/json", `{"a":1}`, false, 0},
		{"charset", "application/json; charset=utf-8", `{"a":1}`, false, 0},
		{"empty allowed", "", ``, true, 0},
		{"empty refused", "application/json", ``, false, 400},
		{"no content type", "", `{"a":1}`, false, 415},
		{"wrong content type", "text/plain", `{"a":1}`, false, 415},
		{"latin1", "application/json; charset=latin1", `{"a":1}`, false, 415},
		{"bad JSON", "application/json", `{"a":`, false, 400},
		{"trailing", "application/json", `{"a":1} {}`, false, 400},
		{"too large", "application/json", `{"a":"` + strings.Repeat("x", 100) + `"}`, false, 413},
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
		if tc.ct != "" {
			r.Header.Set("Content-Type", tc.ct)
		}
		var v map[string]any
		err := DecodeJSON(r, 64, tc.allowEmpty, &v)
		if tc.status == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var re *RequestError
		if !errors.As(err, &re) || re.Status != tc.status {
			t.Errorf("%s: error %v, want status %d", tc.name, err, tc.status)
		}
	}
}

// TestReadJSONBodyLength: the body is read whole whatever Content-Length
// announced (nothing, too little, too much), and the size limit holds.
func TestReadJSONBodyLength(t *testing.T) {
	body := `{"a":"` + strings.Repeat("x", 3000) + `"}`
	for _, cl := range []int64{-1, 0, 3, int64(len(body)), 1 << 20} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = cl
		got, err := ReadJSON(r, 4096, false)
		if err != nil || string(got) != body {
			t.Errorf("Content-Length %d: %d bytes, %v", cl, len(got), err)
		}
		r = httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = cl
		var re *RequestError
		if _, err := ReadJSON(r, 2048, false); !errors.As(err, &re) || re.Status != 413 {
			t.Errorf("Content-Length %d over the limit: %v, want 413", cl, err)
		}
	}
}

func TestErrorBody(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, 409, &Error{Code: "invalid_transition", Message: "m", State: "PAUSED"})
	var body map[string]map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if w.Code != 409 || body["error"]["code"] != "invalid_transition" || body["error"]["state"] != "PAUSED" || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v", w.Code, body)
	}
}

func TestServeShutsDownGracefully(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		time.Sleep(300 * time.Millisecond) // in flight at shutdown
		_, _ = w.Write([]byte("done"))
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, h, logr.Discard()) }()
	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		got <- string(b)
	}()
	<-started
	cancel()
	if s := <-got; s != "done" {
		t.Fatalf("in-flight request got %q", s)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
