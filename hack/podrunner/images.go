package main

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// imageTable is what the runner can "pull": each entry stands for an image
// repository (any tag or digest) and maps the paths the image would hold to
// locally built binaries, with the image config a runtime would apply
// (entrypoint, cmd, user, env, working directory). It is read again at every
// container start, so editing it or rebuilding a binary needs no restart.
type imageTable struct {
	Images []imageConfig `json:"images"`
}

type imageConfig struct {
	// Repository is matched against the container's image without tag or digest.
	Repository string `json:"repository"`
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// User is the image's USER, "uid" or "uid:gid" (numeric only).
	User string `json:"user,omitempty"`
	// Env is the image's ENV, KEY=VALUE.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the image's WORKDIR.
	WorkingDir string `json:"workingDir,omitempty"`
	// Files maps absolute paths inside the image to files on this machine.
	Files map[string]string `json:"files"`
}

func loadImages(file string) (*imageTable, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var t imageTable
	if err := yaml.UnmarshalStrict(raw, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &t, nil
}

// repository strips the tag and digest from an image reference.
func repository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	// A colon after the last slash starts the tag; one before it is a registry port.
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

func (t *imageTable) lookup(image string) (*imageConfig, bool) {
	repo := repository(image)
	for i := range t.Images {
		if t.Images[i].Repository == repo {
			return &t.Images[i], true
		}
	}
	return nil, false
}

func (t *imageTable) repositories() []string {
	out := make([]string, 0, len(t.Images))
	for _, im := range t.Images {
		out = append(out, im.Repository)
	}
	return out
}

// user parses the image's USER; an empty USER is root.
func (c *imageConfig) user() (uid, gid int64, err error) {
	if c.User == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(c.User, ":")
	if uid, err = strconv.ParseInt(u, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("image user %q: only numeric users are supported", c.User)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.ParseInt(g, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("image user %q: only numeric groups are supported", c.User)
		}
	}
	return uid, gid, nil
}

// resolve finds the local file for the program a container runs: an
// absolute path inside the image, or a bare name looked up in the image's
// PATH, as the runtime's exec would.
func (c *imageConfig) resolve(program string, env []string) (string, error) {
	if strings.HasPrefix(program, "/") {
		if f, ok := c.Files[path.Clean(program)]; ok {
			return f, nil
		}
		return "", fmt.Errorf("exec: %q: no such file in the image (the pod runner's image table has %s)", program, c.fileList())
	}
	if strings.Contains(program, "/") {
		return c.resolve(path.Join(c.dir(), program), env)
	}
	pathVar := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for dir := range strings.SplitSeq(pathVar, ":") {
		if f, ok := c.Files[path.Join("/", dir, program)]; ok {
			return f, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH (the pod runner's image table has %s)", program, c.fileList())
}

func (c *imageConfig) dir() string {
	if c.WorkingDir == "" {
		return "/"
	}
	return c.WorkingDir
}

func (c *imageConfig) fileList() string {
	if len(c.Files) == 0 {
		return "no files"
	}
	return strings.Join(sortedKeys(c.Files), ", ")
}
