// Package heapmeter measures what values retain on the heap, for tests
// that hold a structure to a memory budget (a cached object, a session's
// state): the live heap after a full collection, before and after.
package heapmeter

import "runtime"

// Live is the heap's allocated bytes after a full collection (two: the
// first may leave finalized objects for the second).
func Live() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// PerItem is the heap n values made by build retain, per value, in bytes.
// The heap is shared with whatever else the process runs: callers take the
// least of a few tries.
func PerItem(n int, build func(i int) any) float64 {
	held := make([]any, n)
	h0 := Live()
	for i := range held {
		held[i] = build(i)
	}
	per := float64(Live()-h0) / float64(n)
	runtime.KeepAlive(held)
	return per
}
