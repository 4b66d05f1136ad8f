package benchutil

import "testing"

func TestParseAPIWrites(t *testing.T) {
	text := []byte(`# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="hcp.io",resource="hcpsessions",scope="resource",subresource="",verb="POST",version="v1alpha1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="hcp.io",resource="hcpsessions",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 5
apiserver_request_total{code="409",component="apiserver",dry_run="",group="hcp.io",resource="hcpsessions",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="hcp.io",resource="hcpsessionsx",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="GET",version="v1"} 9
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="POST",version="v1"} 2
`)
	w, err := ParseAPIWrites(text)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"POST hcp.io/hcpsessions": 3, "PATCH hcp.io/hcpsessions/status": 6, "POST secrets": 2, "GET secrets": 0} {
		if w[k] != want {
			t.Errorf("%s = %v, want %v (all: %v)", k, w[k], want, w)
		}
	}
	if got := w.Of("hcp.io/hcpsessions"); got != 9 {
		t.Errorf("Of(hcp.io/hcpsessions) = %v, want 9 (not the 7 of hcpsessionsx)", got)
	}
	all, err := ParseAPIRequests(text)
	if err != nil {
		t.Fatal(err)
	}
	if r := all.Reads(); len(r) != 1 || r["GET secrets"] != 9 {
		t.Errorf("Reads() = %v, want only GET secrets 9", r)
	}
	if _, err := ParseAPIWrites([]byte("not { metrics")); err == nil {
		t.Error("garbage parsed without an error")
	}
}
