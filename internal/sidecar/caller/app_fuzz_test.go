package caller

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

// cannedApp answers every POST with one status, HCP-Batch-Max header and
// body, in process.
type cannedApp struct {
	status int
	batch  string
	body   []byte
}

func (a cannedApp) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	if a.batch != "" {
		h.Set(HeaderBatchMax, a.batch)
	}
	return &http.Response{StatusCode: a.status, Status: strconv.Itoa(a.status) + " " + http.StatusText(a.status),
		Header: h, Body: io.NopCloser(bytes.NewReader(a.body)), ContentLength: int64(len(a.body)), Request: req}, nil
}

// FuzzAppResponse: the caller app's answer to an event delivery (one
// event, or a batch), which decides whether the delivery is acked and how
// many events the next request may carry. Nothing panics; only a 2xx is a
// success; the batch size stays within 1..MaxAppBatch and follows the
// app's HCP-Batch-Max offer exactly as documented (a 2xx with a number
// above 1 offers that many, capped; a 2xx without it withdraws the offer;
// the batch path answering 404, 405 or 501 withdraws it for a while;
// other failures change nothing).
func FuzzAppResponse(f *testing.F) {
	f.Add(200, "", []byte(""), false, int32(0))
	f.Add(204, "50", []byte(""), false, int32(0))
	f.Add(200, "5000", []byte("ok"), true, int32(0))
	f.Add(200, "1", []byte(""), true, int32(10))
	f.Add(404, "", []byte("404 page not found"), true, int32(10))
	f.Add(500, "7", []byte("boom\n"+strings.Repeat("x", 1000)), false, int32(10))
	f.Add(299, " 7", []byte(""), false, int32(3))
	f.Add(200, "-3", []byte(""), false, int32(3))
	f.Fuzz(func(t *testing.T, code int, batch string, body []byte, batchPath bool, offered int32) {
		status := 200 + int(uint(code)%400) // what an HTTP server can answer
		s := &Sidecar{cfg: &config.Config{HarnessURL: "http://127.0.0.1:9000/"}, o: Options{AppTimeout: 5 * time.Second},
			http: &http.Client{Transport: cannedApp{status, batch, body}}, m: metrics.New(prometheus.NewRegistry()),
			clk: clock.RealClock{}, log: logr.Discard(), runCtx: context.Background()}
		before := min(max(offered, 0), config.MaxAppBatch)
		s.appBatchMax.Store(before)
		path := EventsPath
		if batchPath {
			path = BatchPath
		}
		err := s.post(path, http.Header{"Content-Type": {"application/json"}}, []byte(`{"event_type":"progress"}`), 1)
		ok := status >= 200 && status <= 299
		if (err == nil) != ok {
			t.Fatalf("HTTP %d: error %v", status, err)
		}
		limit := s.batchLimit()
		if limit < 1 || limit > config.MaxAppBatch {
			t.Fatalf("batch limit %d", limit)
		}
		n, aerr := strconv.Atoi(batch)
		want := int(max(before, 1))
		switch {
		case ok && aerr == nil && n > 1:
			want = min(n, config.MaxAppBatch)
		case ok:
			want = 1
		case batchPath && (status == 404 || status == 405 || status == 501):
			want = 1
			if s.batchRefusedAt.Load() == 0 {
				t.Fatal("a refused batch endpoint was not noted")
			}
		}
		if limit != want {
			t.Fatalf("HTTP %d with %s %q: batch limit %d, want %d (was %d)", status, HeaderBatchMax, batch, limit, want, before)
		}
	})
}
