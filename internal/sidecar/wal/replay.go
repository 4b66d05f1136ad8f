package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"slices"
)

// Reading the log back: the frames, their checksums, and each record
// applied to the sessions' state.

// maxRecord bounds one record (an envelope is at most 1 MiB).
const maxRecord = 8 << 20

// replay applies every valid record of f and returns the offset after the
// last one.
func (l *Log) replay(f *os.File) int64 {
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	hdr := make([]byte, 8)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return off // EOF or a torn header
		}
		n := binary.LittleEndian.Uint32(hdr)
		if n == 0 || n > maxRecord {
			return off
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			return off
		}
		if crc32.Checksum(p, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
			return off
		}
		if err := l.applyRecord(p); err != nil {
			return off
		}
		off += 8 + int64(n)
	}
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) bytes() []byte {
	n, k := binary.Uvarint(r.b)
	if k <= 0 || uint64(len(r.b)-k) < n {
		r.err = errors.New("wal: bad record")
		return nil
	}
	v := r.b[k : k+int(n)]
	r.b = r.b[k+int(n):]
	return v
}

func (r *reader) int() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.err = errors.New("wal: bad record")
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (l *Log) applyRecord(p []byte) error {
	r := &reader{b: p[1:]}
	id := string(r.bytes())
	switch p[0] {
	case kindOpen:
		task := slices.Clone(r.bytes())
		var last int64
		if r.err == nil && len(r.b) > 0 {
			last = r.int()
		}
		if r.err == nil {
			l.sessions[id] = &Session{ID: id, Task: task, LastSeq: last}
		}
	case kindMessage:
		m := Message{Index: r.int(), Seq: r.int()}
		m.Key = string(r.bytes())
		m.RoutingKey = string(r.bytes())
		m.State = string(r.bytes())
		m.Body = slices.Clone(r.bytes())
		if r.err == nil {
			if m.Index == 0 { // a remembered key or a snapshot header
				s := l.session(id)
				if m.Key != "" {
					s.Keys.Put(m.Key, m.Seq)
				}
				break
			}
			if m.RoutingKey == "" { // snapshot header
				s := l.session(id)
				s.LastIndex, s.LastSeq = max(s.LastIndex, m.Index), max(s.LastSeq, m.Seq)
				if m.State != "" {
					s.State = m.State
				}
				break
			}
			l.session(id).apply(m)
		}
	case kindConfirm:
		idx := r.int()
		if r.err == nil {
			l.session(id).confirm(idx)
		}
	case kindClose:
		if r.err == nil {
			delete(l.sessions, id)
		}
	default:
		return errors.New("wal: unknown record")
	}
	return r.err
}
