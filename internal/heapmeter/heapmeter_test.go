package heapmeter

import "testing"

// A 4 KiB buffer per item is measured as about 4 KiB, garbage as nothing.
func TestPerItem(t *testing.T) {
	per := PerItem(1000, func(int) any { return make([]byte, 4096) })
	if per < 4000 || per > 4400 {
		t.Errorf("4 KiB buffers measured %.0f bytes each", per)
	}
	if garbage := PerItem(1000, func(int) any { _ = make([]byte, 4096); return nil }); garbage > 100 {
		t.Errorf("dropped buffers measured %.0f bytes each", garbage)
	}
}
