package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// defaultGoBuildFlags is the Makefile's GO_BUILD_FLAGS, for runs outside
// make; make passes its own value with -go-build-flags.
const defaultGoBuildFlags = `-trimpath -ldflags=-s\ -w`

// goBuild builds pkg of the module in repo/module for linux/arch into out:
// static (CGO_ENABLED=0), with flags, and -buildvcs=false so that a build
// from a git checkout and one from an exported tree give the same binary.
// A module other than the repository root is built with GOWORK=off, as the
// Makefile builds hack/imagebuild: it must not depend on a workspace.
func goBuild(repo, module, pkg, arch, out string, flags []string) error {
	args := append([]string{"build"}, flags...)
	args = append(args, "-buildvcs=false", "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(repo, module)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if module != mainModule {
		cmd.Env = append(cmd.Env, "GOWORK=off")
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "imagebuild: (cd %s && CGO_ENABLED=0 GOOS=linux GOARCH=%s go %s)\n", module, arch, strings.Join(quoteWords(args), " "))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for linux/%s: %w", pkg, arch, err)
	}
	return nil
}

// splitWords splits a make variable's value into words the way the shell
// does for GO_BUILD_FLAGS: blanks separate, a backslash escapes the next
// character, quotes group. `-trimpath -ldflags=-s\ -w` gives two words.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quote != '\'':
			escaped, inWord = true, true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unbalanced quote or trailing backslash in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// quoteWords quotes words with blanks for the log line.
func quoteWords(ws []string) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		if strings.ContainsAny(w, " \t'\"") {
			out[i] = strconv.Quote(w)
		} else {
			out[i] = w
		}
	}
	return out
}

// epochZero is the default SOURCE_DATE_EPOCH, 1970-01-01T00:00:00Z.
var epochZero = time.Unix(0, 0).UTC()

// sourceDateEpoch reads SOURCE_DATE_EPOCH (reproducible-builds.org), 0 when
// unset: the time every layer entry and the image config carry.
func sourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return epochZero, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", v)
	}
	return time.Unix(n, 0).UTC(), nil
}

// chartAppVersion reads appVersion from the chart's Chart.yaml: the
// default image tag, as the chart's own templates default to it.
func chartAppVersion(repo string) (string, error) {
	file := filepath.Join(repo, "charts/hcp-operator/Chart.yaml")
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }() // opened for reading only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "appVersion:"); ok {
			v = strings.Trim(strings.TrimSpace(v), `"'`)
			if v != "" {
				return v, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s has no appVersion", file)
}

// parseTags splits a comma- or blank-separated tag list.
func parseTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

// parsePlatforms reads linux/ARCH items; the images are Linux only.
func parsePlatforms(s string) ([]string, error) {
	var archs []string
	for _, p := range parseTags(s) {
		os, arch, ok := strings.Cut(p, "/")
		if !ok || os != linuxOS || arch == "" {
			return nil, fmt.Errorf("platform %q: want linux/ARCH", p)
		}
		archs = append(archs, arch)
	}
	if len(archs) == 0 {
		return nil, fmt.Errorf("no platform given")
	}
	return archs, nil
}
