package topology

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestMatchID: matchID accepts exactly what IDPattern matches: every
// string of up to four bytes over an alphabet with each kind of byte, and
// random strings around the length limit.
func TestMatchID(t *testing.T) {
	re := regexp.MustCompile(IDPattern)
	alphabet := []byte("az09-_.A@ \n\x00\xff")
	var walk func(s []byte)
	walk = func(s []byte) {
		if got, want := matchID(string(s)), re.Match(s); got != want {
			t.Fatalf("matchID(%q) = %v, the pattern says %v", s, got, want)
		}
		if len(s) < 4 {
			for _, c := range alphabet {
				walk(append(s, c))
			}
		}
	}
	walk(nil)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b := make([]byte, 55+rng.IntN(12))
		for i := range b {
			b[i] = "abz019-_"[rng.IntN(8)]
			if rng.IntN(200) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		if got, want := matchID(string(b)), re.Match(b); got != want {
			t.Fatalf("matchID(%q) = %v, the pattern says %v", b, got, want)
		}
	}
	for _, s := range []string{strings.Repeat("a", 63), strings.Repeat("a", 64), "a-", "-a", "a_b", "a\nb", "ab\n"} {
		if got, want := matchID(s), re.MatchString(s); got != want {
			t.Errorf("matchID(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}

// FuzzMatchID holds matchID to IDPattern on any input.
func FuzzMatchID(f *testing.F) {
	re := regexp.MustCompile(IDPattern)
	for _, s := range []string{"", "a", "lab-cvd", "a_", strings.Repeat("x", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := matchID(s), re.MatchString(s); got != want {
			t.Fatalf("matchID(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
