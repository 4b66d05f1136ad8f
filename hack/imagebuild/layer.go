package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// entry is one file or directory of a layer.
type entry struct {
	Path     string // absolute path in the image
	Dir      bool
	Mode     int64 // permission bits, with 01000 for the sticky bit
	UID, GID int
	Data     []byte
}

// The base layer: what gcr.io/distroless/static:nonroot gives a static Go
// binary, and nothing else (no shell, no package manager, no libc):
//
//   - /etc/passwd and /etc/group with root (0), nobody (65534) and nonroot
//     (65532), distroless's three users, so a process running as 65532 has a
//     name and a home (Go's os/user, and tools that read $HOME);
//   - /etc/ssl/certs/ca-certificates.crt, the CA bundle Go's crypto/x509
//     reads on Linux (SSL_CERT_FILE names it too), for TLS to the API server
//     and to RabbitMQ; copied from the build host's Debian ca-certificates;
//   - /tmp (1777), because libraries write temp files there;
//   - /home/nonroot (0700, owned by 65532), nonroot's home.
//
// distroless also ships tzdata, /etc/os-release and /etc/nsswitch.conf;
// none of the project's binaries read them (they log and schedule in UTC
// and resolve names with Go's resolver, whose default without nsswitch.conf
// is files then DNS, as distroless's file says).
const passwd = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`

const group = `root:x:0:
nobody:x:65534:
nonroot:x:65532:
`

// caBundlePath is where the base layer keeps the CA bundle (and what
// SSL_CERT_FILE names).
const caBundlePath = "/etc/ssl/certs/ca-certificates.crt"

// baseEntries returns the base layer's entries; caBundle is the host's CA
// bundle.
func baseEntries(caBundle []byte) []entry {
	return []entry{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(group)},
		{Path: caBundlePath, Mode: 0o644, Data: caBundle},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
	}
}

// readCABundle reads the host's CA bundle and refuses an empty one: an
// image without roots would fail every TLS handshake at run time.
func readCABundle(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w (install Debian's ca-certificates or pass -ca-bundle)", err)
	}
	if !bytes.Contains(b, []byte("BEGIN CERTIFICATE")) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", file)
	}
	return b, nil
}

// withParents adds the directories leading to every entry that the entries
// do not list themselves (root-owned, 0755, as Docker's COPY creates them),
// so that a runtime extracting the layer never has to invent them with
// modes and owners of its own.
func withParents(entries []entry) []entry {
	have := map[string]bool{}
	for _, e := range entries {
		have[path.Clean(e.Path)] = true
	}
	out := append([]entry(nil), entries...)
	for _, e := range entries {
		for d := path.Dir(path.Clean(e.Path)); d != "/" && d != "."; d = path.Dir(d) {
			if !have[d] {
				have[d] = true
				out = append(out, entry{Path: d, Dir: true, Mode: 0o755})
			}
		}
	}
	return out
}

// layerTar writes entries as an uncompressed tar, reproducibly: entries
// sorted by path (so a directory precedes what it holds), every mtime set
// to epoch, owners numeric with no user or group names, no access or
// change times. The same entries and epoch give the same bytes.
func layerTar(entries []entry, epoch time.Time) ([]byte, error) {
	entries = withParents(entries)
	for i := range entries {
		p := path.Clean(entries[i].Path)
		if !strings.HasPrefix(p, "/") || p == "/" {
			return nil, fmt.Errorf("layer entry %q: want an absolute path below /", entries[i].Path)
		}
		entries[i].Path = p
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	for i := 1; i < len(entries); i++ {
		if entries[i].Path == entries[i-1].Path {
			return nil, fmt.Errorf("layer entry %s given twice", entries[i].Path)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    strings.TrimPrefix(e.Path, "/"),
			Mode:    e.Mode,
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: epoch,
			// PAX would record sub-second times; USTAR has none, and every
			// name here fits it.
			Format: tar.FormatUSTAR,
		}
		if e.Dir {
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Path, err)
		}
		if !e.Dir {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
