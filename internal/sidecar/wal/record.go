package wal

import (
	"encoding/binary"
	"hash/crc32"
)

// The records' encoding: one function per record kind, appended to a
// buffer that Log.write frames and writes in one call.

// appendSnapshot encodes a session's state after its open record: the
// confirmed watermark, then the pending messages, and its remembered keys
// as key-only messages (index 0, never pending).
func appendSnapshot(b []byte, id string, s *Session) []byte {
	b = appendMessage(b, id, Message{Index: s.LastIndex, Seq: s.LastSeq, State: s.State})
	b = appendConfirm(b, id, s.Confirmed)
	for _, k := range s.Keys.order {
		b = appendMessage(b, id, Message{Key: k, Seq: s.Keys.m[k]})
	}
	for _, m := range s.Pending {
		b = appendMessage(b, id, m)
	}
	return b
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func frame(b []byte, payload func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = payload(b)
	p := b[start+8:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(p)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(p, crcTable))
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, v string) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// appendOpen encodes a session's open record; a last sequence other than
// 0 (a session taken over) follows the task (a reader of an earlier
// release ignores it).
func appendOpen(b []byte, id string, task []byte, lastSeq int64) []byte {
	return frame(b, func(b []byte) []byte {
		b = append(b, kindOpen)
		b = appendString(b, id)
		b = appendBytes(b, task)
		if lastSeq != 0 {
			b = binary.AppendVarint(b, lastSeq)
		}
		return b
	})
}

func appendMessage(b []byte, id string, m Message) []byte {
	return frame(b, func(b []byte) []byte {
		b = append(b, kindMessage)
		b = appendString(b, id)
		b = binary.AppendVarint(b, m.Index)
		b = binary.AppendVarint(b, m.Seq)
		b = appendString(b, m.Key)
		b = appendString(b, m.RoutingKey)
		b = appendString(b, m.State)
		return appendBytes(b, m.Body)
	})
}

func appendConfirm(b []byte, id string, index int64) []byte {
	return frame(b, func(b []byte) []byte {
		b = append(b, kindConfirm)
		b = appendString(b, id)
		return binary.AppendVarint(b, index)
	})
}

func appendClose(b []byte, id string) []byte {
	return frame(b, func(b []byte) []byte {
		b = append(b, kindClose)
		return appendString(b, id)
	})
}
