package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// WriteSecretVolume lays data out in dir as the kubelet's atomic writer
// does for a Secret volume: the files in a new hidden directory, the
// ..data symlink swapped to it in one rename, and each key a symlink
// through ..data. Call it again with new data for an update, as the
// kubelet does when the Secret changes.
func WriteSecretVolume(tb testing.TB, dir string, data map[string][]byte) {
	tb.Helper()
	gen, err := os.MkdirTemp(dir, "..gen_")
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(gen, k), v, 0o444); err != nil {
			tb.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, fmt.Sprintf("..data_tmp_%s", filepath.Base(gen)))
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		tb.Fatal(err)
	}
	for k := range data {
		link := filepath.Join(dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
			tb.Fatal(err)
		}
	}
}
