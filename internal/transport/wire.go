package transport

import (
	"net"
	"sync"
	"sync/atomic"
)

// wireHoldMax is how many bytes a wire holds back before it writes them
// anyway: a batch of large messages goes out in pieces of about this size.
const wireHoldMax = 64 << 10

// wire is the socket under one AMQP connection. amqp091-go flushes its
// buffer after every frame it sends (a publish, an ack), so each is a
// system call of its own and, over loopback or a LAN, a packet that the
// broker wakes up to read. During a batch (a publisher's Batch, the acks
// of one AckAll) the bytes of the batch's own sends (own) are held back
// and written together when it ends: one system call, one read for the
// broker. Every other write goes out at once, preceded by what is held, so
// the bytes keep their order. A write error is returned to the next writer
// and closes the socket, so amqp091-go sees the connection fail as on its
// own write. A nil *wire holds nothing.
type wire struct {
	net.Conn

	batches atomic.Int32 // batches in progress (beginBatch without endBatch)

	mu      sync.Mutex
	holding bool   // a batch's own send is being written
	held    []byte // written while holding, not yet on the socket
	err     error  // sticky: the socket failed
	writes  int    // writes that reached the socket (tests)
}

func (w *wire) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	if !w.holding && len(w.held) == 0 {
		n, err := w.Conn.Write(p)
		w.writes++
		if err != nil {
			w.err = err
		}
		return n, err
	}
	w.held = append(w.held, p...)
	if !w.holding || len(w.held) >= wireHoldMax {
		if err := w.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (w *wire) beginBatch() {
	if w == nil {
		return
	}
	w.batches.Add(1)
}

// endBatch writes what is held.
func (w *wire) endBatch() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.batches.Add(-1)
	_ = w.flushLocked()
}

// own runs send, which writes one frame (or one message's frames): while a
// batch is in progress its bytes are held; with none left, what is held
// goes out after it. Outside a batch it only sends: a batch that begins
// meanwhile holds nothing of this send.
func (w *wire) own(send func()) {
	if w == nil || w.batches.Load() == 0 {
		send()
		return
	}
	w.mu.Lock()
	w.holding = true
	w.mu.Unlock()
	send()
	w.mu.Lock()
	w.holding = false
	if w.batches.Load() == 0 {
		_ = w.flushLocked()
	}
	w.mu.Unlock()
}

// flush writes what is held now: a publisher about to wait calls it, as
// what it waits for may answer a held write.
func (w *wire) flush() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.flushLocked()
}

func (w *wire) flushLocked() error {
	if w.err != nil || len(w.held) == 0 {
		w.held = w.held[:0]
		return w.err
	}
	_, err := w.Conn.Write(w.held)
	w.writes++
	if cap(w.held) > 4*wireHoldMax {
		w.held = nil
	} else {
		w.held = w.held[:0]
	}
	if err != nil {
		// amqp091-go believes these bytes were written: close the socket,
		// so that its reader fails and the connection is redialled; their
		// messages' confirms fail with ErrConnectionLost.
		w.err = err
		_ = w.Close() // the socket (wire does not wrap Close)
	}
	return err
}
