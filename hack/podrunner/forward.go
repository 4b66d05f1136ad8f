package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// forward is a TCP relay from an address pods can reach (on the bridge) to a
// service of this machine that listens on loopback only: the API server
// behind the kubernetes Service's ClusterIP, RabbitMQ's AMQP port. It stands
// in for kube-proxy for these few fixed endpoints.
type forward struct {
	listen, target string
}

func parseForward(s string) (forward, error) {
	l, t, ok := strings.Cut(s, "=")
	if !ok {
		return forward{}, fmt.Errorf("--forward %q: want LISTEN_HOST:PORT=TARGET_HOST:PORT", s)
	}
	for _, a := range []string{l, t} {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return forward{}, fmt.Errorf("--forward %q: %w", s, err)
		}
	}
	return forward{listen: l, target: t}, nil
}

func (f forward) run(ctx context.Context, log *slog.Logger) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", f.listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		// Something already listens there, typically the service itself on
		// all interfaces: pods reach it without us.
		log.Info("Not forwarding: the address is already served", "listen", f.listen, "target", f.target)
		return nil
	}
	if err != nil {
		return fmt.Errorf("forward %s → %s: %w", f.listen, f.target, err)
	}
	log.Info("Forwarding", "listen", f.listen, "target", f.target)
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Error("Accept failed", "listen", f.listen, "err", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			go f.relay(ctx, c, log)
		}
	}()
	return nil
}

func (f forward) relay(ctx context.Context, in net.Conn, log *slog.Logger) {
	defer func() { _ = in.Close() }()
	d := net.Dialer{Timeout: 10 * time.Second}
	out, err := d.DialContext(ctx, "tcp", f.target)
	if err != nil {
		log.Error("Forward dial failed", "target", f.target, "from", in.RemoteAddr().String(), "err", err)
		return
	}
	defer func() { _ = out.Close() }()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	wg.Add(2)
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
}
