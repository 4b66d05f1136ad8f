package caller

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

// TestNoteBatchOffer: what each answer of the app does to the batch size
// of the next request.
func TestNoteBatchOffer(t *testing.T) {
	answer := func(code int, offer string) *http.Response {
		h := http.Header{}
		if offer != "" {
			h.Set(HeaderBatchMax, offer)
		}
		return &http.Response{StatusCode: code, Header: h}
	}
	steps := []struct {
		what string
		path string
		resp *http.Response
		want int
	}{
		{"no offer yet", EventsPath, answer(204, ""), 1},
		{"an offer", EventsPath, answer(200, "50"), 50},
		{"a failure says nothing", BatchPath, answer(500, ""), 50},
		{"a 404 on an event says nothing of batches", EventsPath, answer(404, ""), 50},
		{"a larger offer is capped", BatchPath, answer(204, "5000"), config.MaxAppBatch},
		{"a 2xx without the header withdraws", BatchPath, answer(204, ""), 1},
		{"an offer again", EventsPath, answer(204, "20"), 20},
		{"the batch endpoint gone", BatchPath, answer(404, ""), 1},
		{"an offer again", EventsPath, answer(204, "20"), 20},
		{"the batch endpoint refuses the method", BatchPath, answer(405, ""), 1},
		{"an offer of 1 is no offer", EventsPath, answer(204, "1"), 1},
		{"a malformed offer is no offer", EventsPath, answer(204, "lots"), 1},
		{"a negative offer is no offer", EventsPath, answer(204, "-3"), 1},
	}
	s := &Sidecar{m: metrics.New(prometheus.NewRegistry())}
	for _, st := range steps {
		s.noteBatchOffer(st.path, st.resp)
		if got := s.batchLimit(); got != st.want {
			t.Errorf("%s: batch limit %d, want %d", st.what, got, st.want)
		}
		if got := testutil.ToFloat64(s.m.AppBatchMax); got != float64(st.want) {
			t.Errorf("%s: hcp_sidecar_app_batch_max %v, want %d", st.what, got, st.want)
		}
	}

	fixed := &Sidecar{o: Options{AppMaxBatch: 30}, m: metrics.New(prometheus.NewRegistry())}
	fixed.noteBatchOffer(EventsPath, answer(204, "5"))
	if got := fixed.batchLimit(); got != 30 {
		t.Errorf("with AppMaxBatch 30 and an offer of 5: batch limit %d, want 30 (the option wins)", got)
	}
}
