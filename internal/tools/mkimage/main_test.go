package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// untar extracts the layout tarball file into dir.
func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// layerFiles lists the regular files and directories of an image's layers.
func layerFiles(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			h.PAXRecords = map[string]string{"content": string(b)}
			out[strings.TrimSuffix(h.Name, "/")] = h
		}
		rc.Close()
	}
	return out
}

// TestImage builds the daemon's image for two platforms from tiny
// binaries, writes the OCI layout tarball, reads it back and checks what
// a container runtime would run: entrypoint, non-root user, labels, and
// the binary in the layer.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bins := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(dir, "forgeyard-daemon-"+arch)
		os.WriteFile(p, []byte("\x7fELF tiny "+arch+" binary"), 0o755)
		bins["linux/"+arch] = p
	}
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644)
	created := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	out := filepath.Join(dir, "daemon_oci.tar")
	var stdout, stderr bytes.Buffer
	args := []string{"--name", "forgeyard-daemon", "--binary", "linux/amd64=" + bins["linux/amd64"], "--binary", "linux/arm64=" + bins["linux/arm64"],
		"--version", "v1.4.0", "--revision", "0123abcd", "--source", "https://git.example/forgeyard", "--ca-certificates", ca, "--source-date-epoch", strconv.FormatInt(created.Unix(), 10), "--out", out}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("mkimage: exit %d: %s", code, stderr.String())
	}
	lay := filepath.Join(dir, "layout")
	untar(t, out, lay)
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	om, err := outer.IndexManifest()
	if err != nil || len(om.Manifests) != 1 || om.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.4.0" {
		t.Fatalf("layout index.json: %+v, %v", om, err)
	}
	idx, err := outer.ImageIndex(om.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 2 {
		t.Fatalf("image index: %+v, %v", im, err)
	}
	var archs []string
	for _, d := range im.Manifests {
		archs = append(archs, d.Platform.OS+"/"+d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/forgeyard-daemon"}) || !slices.Equal(c.Cmd, []string{"--config", "/etc/forgeyard/daemon.toml"}) {
			t.Errorf("%s: entrypoint %q cmd %q", d.Platform, c.Entrypoint, c.Cmd)
		}
		uid, _, _ := strings.Cut(c.User, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 || c.User != "65532:65532" {
			t.Errorf("%s: user %q; want a numeric non-root uid (65532:65532)", d.Platform, c.User)
		}
		for k, v := range map[string]string{"org.opencontainers.image.title": "forgeyard-daemon", "org.opencontainers.image.version": "v1.4.0",
			"org.opencontainers.image.revision": "0123abcd", "org.opencontainers.image.created": "2026-12-01T00:00:00Z",
			"org.opencontainers.image.source": "https://git.example/forgeyard"} {
			if c.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", d.Platform, k, c.Labels[k], v)
			}
		}
		if cf.Architecture != d.Platform.Architecture || cf.OS != "linux" || !cf.Created.Time.Equal(created) {
			t.Errorf("%s: config says %s/%s created %v", d.Platform, cf.OS, cf.Architecture, cf.Created)
		}
		if _, ok := c.ExposedPorts["7443/udp"]; !ok {
			t.Errorf("%s: ports %v", d.Platform, c.ExposedPorts)
		}
		files := layerFiles(t, img)
		bin := files["usr/local/bin/forgeyard-daemon"]
		want, _ := os.ReadFile(bins[d.Platform.OS+"/"+d.Platform.Architecture])
		if bin == nil || bin.PAXRecords["content"] != string(want) || bin.Mode&0o111 == 0 {
			t.Errorf("%s: the binary is not in the layer as built (header %+v)", d.Platform, bin)
		}
		if st := files["var/lib/forgeyard"]; st == nil || st.Uid != 65532 || c.WorkingDir != "/var/lib/forgeyard" {
			t.Errorf("%s: state directory %+v, workdir %q", d.Platform, st, c.WorkingDir)
		}
		if pw := files["etc/passwd"]; pw == nil || !strings.Contains(pw.PAXRecords["content"], "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd lacks the user", d.Platform)
		}
		if files["etc/ssl/certs/ca-certificates.crt"] == nil {
			t.Errorf("%s: no CA bundle", d.Platform)
		}
	}
	slices.Sort(archs)
	if !slices.Equal(archs, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %q", archs)
	}
	// Reproducible: the same inputs give the same bytes.
	out2 := filepath.Join(dir, "again.tar")
	args[len(args)-1] = out2
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(out2)
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same inputs differ")
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"--out", "x.tar"}, {"--name", "forgeyard-daemon"}, {"--bogus"}} {
		var o, e bytes.Buffer
		if code := run(args, &o, &e); code != 2 {
			t.Errorf("%q: exit %d: %s", args, code, e.String())
		}
	}
	var o, e bytes.Buffer
	if code := run([]string{"--name", "forgeyard", "--binary", "linux/amd64=/dev/null", "--ca-certificates", "", "--out", filepath.Join(t.TempDir(), "x.tar")}, &o, &e); code != 1 || !strings.Contains(e.String(), "no image for") {
		t.Errorf("the CLI has no image: exit %d: %s", code, e.String())
	}
}

// TestDockerfiles: the target <name> of packaging/docker/Dockerfile
// builds the same image as mkimage: the entrypoint, the numeric non-root
// user, the command, the ports and the label keys. A target's lines are
// its stage's and those of the stages it is FROM or copies --from.
func TestDockerfiles(t *testing.T) {
	file := filepath.Join("..", "..", "..", "packaging", "docker", "Dockerfile")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string][]string{} // stage name → its lines, FROM first
	var last string
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(string(b), "\\\n", " ")))
	for sc.Scan() {
		l := strings.Join(strings.Fields(sc.Text()), " ")
		if f := strings.Fields(l); len(f) == 4 && f[0] == "FROM" && f[2] == "AS" {
			last = f[3]
		}
		if last != "" && l != "" && !strings.HasPrefix(l, "#") {
			stages[last] = append(stages[last], l)
		}
	}
	if last != "forgeyard-daemon" {
		t.Errorf("%s: the last stage (the default target) is %q, want forgeyard-daemon", file, last)
	}
	var linesOf func(stage string, seen map[string]bool) []string
	linesOf = func(stage string, seen map[string]bool) []string {
		if seen[stage] {
			return nil
		}
		seen[stage] = true
		lines := stages[stage]
		for _, l := range stages[stage] {
			f := strings.Fields(l)
			if f[0] == "FROM" {
				lines = append(lines, linesOf(f[1], seen)...)
			}
			if from, ok := strings.CutPrefix(l, "COPY --from="); ok {
				lines = append(lines, linesOf(strings.Fields(from)[0], seen)...)
			}
		}
		return lines
	}
	for name, role := range Roles {
		if stages[name] == nil {
			t.Errorf("%s has no target %s", file, name)
			continue
		}
		own := stages[name]
		lines := linesOf(name, map[string]bool{})
		has := func(prefix string) bool {
			return slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
		}
		cmd := `CMD ["` + strings.Join(role.Cmd, `", "`) + `"]`
		for _, want := range []string{`ENTRYPOINT ["/usr/local/bin/` + name + `"]`, "USER 65532:65532", cmd, "WORKDIR /var/lib/forgeyard",
			"ENV CGO_ENABLED=0", "FROM gcr.io/distroless/static-debian12:nonroot"} {
			if !has(want) {
				t.Errorf("%s target %s lacks a line %q", file, name, want)
			}
		}
		all := strings.Join(lines, "\n")
		if !strings.Contains(all, "-trimpath") || !strings.Contains(all, "./cmd/"+name) {
			t.Errorf("%s target %s does not build ./cmd/%s with -trimpath", file, name, name)
		}
		for _, p := range role.Ports {
			if !slices.Contains(own, "EXPOSE "+p) {
				t.Errorf("%s target %s lacks EXPOSE %s", file, name, p)
			}
		}
		if n := len(slices.DeleteFunc(slices.Clone(own), func(l string) bool { return !strings.HasPrefix(l, "EXPOSE ") })); n != len(role.Ports) {
			t.Errorf("%s target %s exposes %d ports, mkimage %d", file, name, n, len(role.Ports))
		}
		for k := range Labels(Options{Name: name, Source: "x"}) {
			if !strings.Contains(all, k+"=") {
				t.Errorf("%s target %s lacks the label %s", file, name, k)
			}
		}
	}
}
