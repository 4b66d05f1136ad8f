package harnessclient

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			if r.Header.Get("Content-Type") != "application/json" {
				http.Error(w, "no JSON content type", http.StatusUnsupportedMediaType)
				return
			}
			var in map[string]string
			_ = json.NewDecoder(r.Body).Decode(&in)
			_ = json.NewEncoder(w).Encode(map[string]string{"got": in["x"]})
		case "/invalid":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"code":"invalid_request","message":"invalid task","fields":[{"field":"capability","message":"unknown"}]}}`))
		case "/proxy":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>\n  bad   gateway\n</html>" + strings.Repeat("x", 400)))
		case "/garbled":
			_, _ = w.Write([]byte("not json"))
		}
	}))
	defer srv.Close()

	var out map[string]string
	if err := New(srv.URL+"/", "").Do(t.Context(), http.MethodPost, "/echo", map[string]string{"x": "y"}, &out); err != nil || out["got"] != "y" {
		t.Fatalf("echo: %v %v", out, err)
	}

	for _, tc := range []struct {
		peer, path, want string
		status           int
	}{
		{"", "/invalid", "HTTP 400 invalid_request: invalid task; capability: unknown", 400},
		{"the Caller sidecar", "/invalid", "the Caller sidecar answered 400 invalid_request: invalid task; capability: unknown", 400},
		{"", "/proxy", "HTTP 502 http_error: <html> bad gateway </html>xxx", 502},
	} {
		err := New(srv.URL, tc.peer).Do(t.Context(), http.MethodGet, tc.path, nil, nil)
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != tc.status || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s with peer %q: %v, want %q", tc.path, tc.peer, err, tc.want)
		}
		if tc.path == "/proxy" && len([]rune(ae.Message)) != maxRawMessage {
			t.Errorf("raw message of %d runes, want %d", len([]rune(ae.Message)), maxRawMessage)
		}
	}

	err := New(srv.URL, "the Caller sidecar").Do(t.Context(), http.MethodGet, "/garbled", nil, &out)
	if err == nil || !strings.HasPrefix(err.Error(), "the Caller sidecar's answer to GET /garbled: ") {
		t.Errorf("garbled answer: %v", err)
	}
}
