package caller

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestSubmitPublishesWhileItsRecordIsWritten: a task's publish does not
// wait for the fsync of its record (the two overlap, so acceptance pays
// the longer of them, not both), and the app is still answered only once
// the record is durable.
func TestSubmitPublishesWhileItsRecordIsWritten(t *testing.T) {
	bd := newBed(t, "lab")
	st, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	held, release := make(chan struct{}, 16), make(chan struct{})
	st.fsync = func(f *os.File) error {
		held <- struct{}{}
		<-release
		return f.Sync()
	}
	r := bd.start(func(o *Options) { o.Store = st })

	answered := make(chan int, 1)
	go func() {
		var v TaskView
		answered <- r.call(t, http.MethodPost, "/hcp/v1/tasks", taskReq("lab"), &v)
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the task's record was never written")
	}
	// The fsync is held: the task_submit must reach the callee meanwhile.
	queue := topology.CommandQueue("lab")
	ch, err := bd.callee("lab").channel()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok && d.Type == "task_submit" {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("the task_submit was not published while its record's fsync was under way (%s stayed empty): acceptance pays the fsync and the confirm one after the other", queue)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case code := <-answered:
		close(release)
		t.Fatalf("the app was answered (HTTP %d) before its task's record was durable", code)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case code := <-answered:
		if code != http.StatusAccepted {
			t.Fatalf("POST /hcp/v1/tasks: HTTP %d once the record was written", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app was not answered after the record was written")
	}
}
