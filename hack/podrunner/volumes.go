package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// tokenSource issues service-account tokens bound to a pod (the TokenRequest
// API), caching them until they need renewing.
type tokenSource interface {
	Token(ctx context.Context, pod *corev1.Pod, audience string, expirationSeconds int64) (string, error)
}

type fileContent struct {
	data []byte
	mode fs.FileMode
}

// volumeFiles computes the content of a Secret, ConfigMap, projected or
// downward-API volume. ok is false for the kinds that are directories rather
// than generated files (emptyDir, hostPath).
func volumeFiles(ctx context.Context, src objectSource, tokens tokenSource, pc podEnvContext, v *corev1.Volume) (files map[string]fileContent, ok bool, err error) {
	pod := pc.pod
	files = map[string]fileContent{}
	switch {
	case v.Secret != nil:
		mode := fileMode(v.Secret.DefaultMode, 0o644)
		s, err := src.Secret(ctx, pod.Namespace, v.Secret.SecretName)
		if err != nil {
			if apierrors.IsNotFound(err) && ptrTrue(v.Secret.Optional) {
				return files, true, nil
			}
			return nil, true, fmt.Errorf("secret %q: %w", v.Secret.SecretName, err)
		}
		return files, true, addKeys(files, s.Data, v.Secret.Items, mode, ptrTrue(v.Secret.Optional), "Secret "+v.Secret.SecretName)
	case v.ConfigMap != nil:
		mode := fileMode(v.ConfigMap.DefaultMode, 0o644)
		cm, err := src.ConfigMap(ctx, pod.Namespace, v.ConfigMap.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && ptrTrue(v.ConfigMap.Optional) {
				return files, true, nil
			}
			return nil, true, fmt.Errorf("configmap %q: %w", v.ConfigMap.Name, err)
		}
		return files, true, addKeys(files, configMapData(cm), v.ConfigMap.Items, mode, ptrTrue(v.ConfigMap.Optional), "ConfigMap "+v.ConfigMap.Name)
	case v.DownwardAPI != nil:
		mode := fileMode(v.DownwardAPI.DefaultMode, 0o644)
		return files, true, addDownward(files, pc, v.DownwardAPI.Items, mode)
	case v.Projected != nil:
		files, err := projectedFiles(ctx, src, tokens, pc, v.Projected)
		return files, true, err
	case v.EmptyDir != nil, v.HostPath != nil:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("volume %q: this volume type is not supported by the local pod runner (supported: secret, configMap, projected, downwardAPI, emptyDir, hostPath)", v.Name)
}

// projectedFiles computes a projected volume: Secrets, ConfigMaps, the
// downward API and service-account tokens in one directory.
func projectedFiles(ctx context.Context, src objectSource, tokens tokenSource, pc podEnvContext, p *corev1.ProjectedVolumeSource) (map[string]fileContent, error) {
	pod := pc.pod
	files := map[string]fileContent{}
	mode := fileMode(p.DefaultMode, 0o644)
	for _, s := range p.Sources {
		switch {
		case s.Secret != nil:
			sec, err := src.Secret(ctx, pod.Namespace, s.Secret.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && ptrTrue(s.Secret.Optional) {
					continue
				}
				return nil, fmt.Errorf("secret %q: %w", s.Secret.Name, err)
			}
			if err := addKeys(files, sec.Data, s.Secret.Items, mode, ptrTrue(s.Secret.Optional), "Secret "+s.Secret.Name); err != nil {
				return nil, err
			}
		case s.ConfigMap != nil:
			cm, err := src.ConfigMap(ctx, pod.Namespace, s.ConfigMap.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && ptrTrue(s.ConfigMap.Optional) {
					continue
				}
				return nil, fmt.Errorf("configmap %q: %w", s.ConfigMap.Name, err)
			}
			if err := addKeys(files, configMapData(cm), s.ConfigMap.Items, mode, ptrTrue(s.ConfigMap.Optional), "ConfigMap "+s.ConfigMap.Name); err != nil {
				return nil, err
			}
		case s.DownwardAPI != nil:
			if err := addDownward(files, pc, s.DownwardAPI.Items, mode); err != nil {
				return nil, err
			}
		case s.ServiceAccountToken != nil:
			exp := int64(3600)
			if s.ServiceAccountToken.ExpirationSeconds != nil {
				exp = *s.ServiceAccountToken.ExpirationSeconds
			}
			tok, err := tokens.Token(ctx, pod, s.ServiceAccountToken.Audience, exp)
			if err != nil {
				return nil, fmt.Errorf("service account token: %w", err)
			}
			// Tokens are readable by the pod's user only when no
			// fsGroup is set, as the kubelet does: 0600 unless a mode is given.
			tokMode := mode
			if p.DefaultMode == nil {
				tokMode = 0o600
				if pod.Spec.SecurityContext != nil && pod.Spec.SecurityContext.FSGroup != nil {
					tokMode = 0o640
				}
			}
			files[s.ServiceAccountToken.Path] = fileContent{data: []byte(tok), mode: tokMode}
		case s.ClusterTrustBundle != nil, s.PodCertificate != nil:
			return nil, fmt.Errorf("projected source %s is not supported by the local pod runner", projectedKind(s))
		}
	}
	return files, nil
}

func projectedKind(s corev1.VolumeProjection) string {
	if s.ClusterTrustBundle != nil {
		return "clusterTrustBundle"
	}
	return "podCertificate"
}

func configMapData(cm *corev1.ConfigMap) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	maps := cm.BinaryData
	for k, v := range maps {
		out[k] = v
	}
	return out
}

func addKeys(files map[string]fileContent, data map[string][]byte, items []corev1.KeyToPath, mode fs.FileMode, optional bool, what string) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = fileContent{data: v, mode: mode}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, it.Key)
		}
		files[it.Path] = fileContent{data: v, mode: fileMode(it.Mode, mode)}
	}
	return nil
}

func addDownward(files map[string]fileContent, pc podEnvContext, items []corev1.DownwardAPIVolumeFile, mode fs.FileMode) error {
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = podField(pc, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			c := findContainer(pc.pod, it.ResourceFieldRef.ContainerName)
			if c == nil {
				return fmt.Errorf("downward API %s: no container %q", it.Path, it.ResourceFieldRef.ContainerName)
			}
			v, err = resourceField(pc, c, it.ResourceFieldRef)
		}
		if err != nil {
			return fmt.Errorf("downward API %s: %w", it.Path, err)
		}
		files[it.Path] = fileContent{data: []byte(v), mode: fileMode(it.Mode, mode)}
	}
	return nil
}

func fileMode(m *int32, def fs.FileMode) fs.FileMode {
	if m == nil {
		return def
	}
	return fs.FileMode(*m) & 0o777
}

const dataDirName = "..data"

// writeAtomic makes dir hold exactly files, the way the kubelet's
// AtomicWriter does: the files live in a timestamped directory reached
// through the ..data symlink, and each top-level name is a symlink through
// ..data, so a reader never sees a half-updated volume. It writes nothing
// when the content is unchanged. gid, when not -1, owns the files (fsGroup).
func writeAtomic(dir string, files map[string]fileContent, gid int) (changed bool, err error) {
	for p := range files {
		if filepath.IsAbs(p) || slices.Contains(strings.Split(p, "/"), "..") {
			return false, fmt.Errorf("invalid volume path %q", p)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	if same(dir, files, gid) {
		return false, nil
	}
	ts, err := os.MkdirTemp(dir, "..ts-")
	if err != nil {
		return false, err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return false, err
	}
	for p, f := range files {
		target := filepath.Join(ts, p)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return false, err
		}
		if err := os.WriteFile(target, f.data, f.mode); err != nil {
			return false, err
		}
		if err := os.Chmod(target, f.mode); err != nil {
			return false, err
		}
		if gid >= 0 {
			if err := os.Chown(target, 0, gid); err != nil {
				return false, err
			}
		}
	}
	oldTarget, _ := os.Readlink(filepath.Join(dir, dataDirName))
	tmpLink := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(ts), tmpLink); err != nil {
		return false, err
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, dataDirName)); err != nil {
		return false, err
	}
	top := map[string]bool{}
	for p := range files {
		top[strings.SplitN(p, "/", 2)[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if t, err := os.Readlink(link); err == nil && t == filepath.Join(dataDirName, name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join(dataDirName, name), link); err != nil {
			return false, err
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") || top[e.Name()] {
			continue
		}
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(t, dataDirName+"/") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	if oldTarget != "" && oldTarget != filepath.Base(ts) {
		_ = os.RemoveAll(filepath.Join(dir, oldTarget))
	}
	return true, nil
}

// same reports whether dir's ..data already holds exactly files.
func same(dir string, files map[string]fileContent, gid int) bool {
	data := filepath.Join(dir, dataDirName)
	if _, err := os.Stat(data); err != nil {
		return false
	}
	n := 0
	err := filepath.WalkDir(data+"/", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		rel, _ := filepath.Rel(data, p)
		f, ok := files[rel]
		if !ok {
			return fs.ErrNotExist
		}
		info, err := d.Info()
		if err != nil || info.Mode().Perm() != f.mode {
			return fs.ErrNotExist
		}
		if gid >= 0 && fileGID(info) != gid {
			return fs.ErrNotExist
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, f.data) {
			return fs.ErrNotExist
		}
		return nil
	})
	return err == nil && n == len(files)
}
