package caller

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

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
		what  string
		after time.Duration // the clock moves this much first
		path  string
		resp  *http.Response
		want  int
	}{
		{"no offer yet", 0, EventsPath, answer(204, ""), 1},
		{"an offer", 0, EventsPath, answer(200, "50"), 50},
		{"a failure says nothing", 0, BatchPath, answer(500, ""), 50},
		{"a 404 on an event says nothing of batches", 0, EventsPath, answer(404, ""), 50},
		{"a larger offer is capped", 0, BatchPath, answer(204, "5000"), config.MaxAppBatch},
		{"a 2xx without the header withdraws", 0, BatchPath, answer(204, ""), 1},
		{"an offer again", 0, EventsPath, answer(204, "20"), 20},
		{"the batch endpoint gone", 0, BatchPath, answer(404, ""), 1},
		{"an offer right after a refusal is ignored", time.Second, EventsPath, answer(204, "20"), 1},
		{"and still ignored just before the hold ends", batchRefusalHold - 2*time.Second, EventsPath, answer(204, "20"), 1},
		{"an offer after the hold", time.Second, EventsPath, answer(204, "20"), 20},
		{"the batch endpoint refuses the method", 0, BatchPath, answer(405, ""), 1},
		{"an offer of 1 is no offer", batchRefusalHold, EventsPath, answer(204, "1"), 1},
		{"a malformed offer is no offer", 0, EventsPath, answer(204, "lots"), 1},
		{"a negative offer is no offer", 0, EventsPath, answer(204, "-3"), 1},
		{"a valid offer again", 0, EventsPath, answer(204, "7"), 7},
	}
	clk := clocktesting.NewFakeClock(time.Now())
	s := &Sidecar{m: metrics.New(prometheus.NewRegistry()), clk: clk}
	for _, st := range steps {
		clk.Step(st.after)
		s.noteBatchOffer(st.path, st.resp.StatusCode, st.resp.Header)
		if got := s.batchLimit(); got != st.want {
			t.Errorf("%s: batch limit %d, want %d", st.what, got, st.want)
		}
		if got := testutil.ToFloat64(s.m.AppBatchMax); got != float64(st.want) {
			t.Errorf("%s: hcp_sidecar_app_batch_max %v, want %d", st.what, got, st.want)
		}
	}

	fixed := &Sidecar{o: Options{AppMaxBatch: 30}, m: metrics.New(prometheus.NewRegistry())}
	fixed.noteBatchOffer(EventsPath, 204, answer(204, "5").Header)
	if got := fixed.batchLimit(); got != 30 {
		t.Errorf("with AppMaxBatch 30 and an offer of 5: batch limit %d, want 30 (the option wins)", got)
	}
}
