package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// serveKubeletAPI serves the part of the kubelet API the API server proxies
// for `kubectl logs`: GET /containerLogs/{namespace}/{pod}/{container}
// (follow, tailLines, limitBytes). exec, attach and port-forward are not
// available. Only the API server's kubelet client certificate is accepted.
func (r *runner) serveKubeletAPI(ctx context.Context) error {
	caPEM, err := os.ReadFile(r.o.clientCA)
	if err != nil {
		return fmt.Errorf("kubelet API client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("kubelet API client CA %s: no certificates", r.o.clientCA)
	}
	cert, err := tls.LoadX509KeyPair(r.o.tlsCert, r.o.tlsKey)
	if err != nil {
		return fmt.Errorf("kubelet API serving certificate: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", r.containerLogs)
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "not supported by the local pod runner (only /containerLogs): "+req.URL.Path, http.StatusNotImplemented)
	})
	srv := &http.Server{
		Addr:              net.JoinHostPort(r.hostIP, strconv.Itoa(r.o.kubeletPort)),
		Handler:           requireAPIServer(mux),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.VerifyClientCertIfGiven,
			MinVersion:   tls.VersionTLS12,
		},
	}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("kubelet API: %w", err)
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("Kubelet API failed", "err", err)
		}
	}()
	r.log.Info("Serving the kubelet API (container logs)", "address", srv.Addr)
	return nil
}

// requireAPIServer admits clients with a verified certificate of
// system:masters (the API server's kubelet client certificate is one).
func requireAPIServer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/healthz" {
			next.ServeHTTP(w, req)
			return
		}
		if req.TLS == nil || len(req.TLS.VerifiedChains) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		if !slices.Contains(req.TLS.VerifiedChains[0][0].Subject.Organization, "system:masters") {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, req)
	})
}

func (r *runner) containerLogs(w http.ResponseWriter, req *http.Request) {
	ns, pod, container := req.PathValue("namespace"), req.PathValue("pod"), req.PathValue("container")
	q := req.URL.Query()
	if previous, _ := strconv.ParseBool(q.Get("previous")); previous {
		http.Error(w, "previous container logs are not kept apart by the local pod runner: the log file holds every run", http.StatusBadRequest)
		return
	}
	path := filepath.Join(r.o.logDir, fmt.Sprintf("%s_%s_%s.log", ns, pod, container))
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, fmt.Sprintf("container %q in pod %q is waiting to start or has no logs", container, pod), http.StatusNotFound)
		return
	}
	defer func() { _ = f.Close() }()
	if n, err := strconv.Atoi(q.Get("tailLines")); err == nil && n >= 0 {
		if err := seekTail(f, n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	var out io.Writer = w
	limit := int64(-1)
	if n, err := strconv.ParseInt(q.Get("limitBytes"), 10, 64); err == nil && n > 0 {
		limit = n
	}
	w.Header().Set("Content-Type", "text/plain")
	flusher, _ := w.(http.Flusher)
	copyN := func() bool {
		var n int64
		var err error
		if limit >= 0 {
			n, err = io.CopyN(out, f, limit)
			limit -= n
		} else {
			_, err = io.Copy(out, f)
		}
		if flusher != nil {
			flusher.Flush()
		}
		return (err == nil || errors.Is(err, io.EOF)) && limit != 0
	}
	follow, _ := strconv.ParseBool(q.Get("follow"))
	if !copyN() || !follow {
		return
	}
	for {
		select {
		case <-req.Context().Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if !copyN() {
			return
		}
		if _, err := os.Stat(path); err != nil {
			return
		}
	}
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	// Read backwards in blocks, counting newlines.
	const block = 64 << 10
	size := st.Size()
	count := 0
	pos := size
	buf := make([]byte, block)
	for pos > 0 {
		readSize := int64(block)
		if pos < readSize {
			readSize = pos
		}
		pos -= readSize
		if _, err := f.ReadAt(buf[:readSize], pos); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for i := readSize - 1; i >= 0; i-- {
			if buf[i] != '\n' || pos+i == size-1 {
				continue
			}
			count++
			if count == n {
				_, err := f.Seek(pos+i+1, io.SeekStart)
				return err
			}
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}
