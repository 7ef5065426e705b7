// Command mkimage assembles the OCI image of one Forgeyard server binary
// (forgeyard-daemon, forgeyard-agent or forgeyard-relay) without a
// container builder, as ko does: a base layer (passwd and group with the
// non-root user 65532, CA certificates, /tmp, the state directory) and a
// layer with the static binary, one image per platform under an OCI image
// index, written as an OCI image layout tarball. `make release` runs it;
// the target <name> of packaging/docker/Dockerfile builds the same image
// with a container builder.
//
//	go run ./internal/tools/mkimage --name forgeyard-daemon \
//	    --binary linux/amd64=out/release/stage/linux_amd64/forgeyard-daemon \
//	    --binary linux/arm64=out/release/stage/linux_arm64/forgeyard-daemon \
//	    --version v1.2.3 --revision $(git rev-parse HEAD) --out out/release/forgeyard-daemon_v1.2.3_oci.tar
//
// Load it with `skopeo copy oci-archive:FILE docker-daemon:forgeyard-daemon:v1.2.3`
// or `podman load -i FILE`.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"forgeyard.dev/transport/internal/cli"
)

// The non-root user every image runs as (distroless' "nonroot").
const (
	UID      = 65532
	UserName = "nonroot"
)

// BinDir is where the binary lives in the image.
const BinDir = "/usr/local/bin"

// StateDir is the working directory, writable by UID (authority database,
// logs, CAS objects, the agent's status file).
const StateDir = "/var/lib/forgeyard"

// Role is what an image of one binary needs besides the binary.
type Role struct {
	Description string
	Cmd         []string // arguments after the entrypoint
	Ports       []string // exposed, "7443/udp"
}

// Roles are the binaries that get an image. The target <name> of
// packaging/docker/Dockerfile says the same (the test checks).
var Roles = map[string]Role{
	"forgeyard-daemon": {Description: "Forgeyard Transport daemon: accepts agents over QUIC, TLS+yamux and WebTransport",
		Cmd: []string{"--config", "/etc/forgeyard/daemon.toml"}, Ports: []string{"7443/udp", "7444/tcp", "9464/tcp"}},
	"forgeyard-agent": {Description: "Forgeyard Transport build agent",
		Cmd: []string{"--config", "/etc/forgeyard/agent.toml"}, Ports: []string{"9465/tcp"}},
	"forgeyard-relay": {Description: "Forgeyard Transport relay: TLS+yamux and WebTransport agents to daemons over QUIC",
		Cmd: []string{"--config", "/etc/forgeyard/relay.toml"}, Ports: []string{"443/tcp", "443/udp", "9465/tcp"}},
}

// Options say what to build.
type Options struct {
	Name     string            // a key of Roles
	Binaries map[string]string // platform "linux/amd64" → binary file
	Version  string            // org.opencontainers.image.version
	Revision string            // org.opencontainers.image.revision
	Created  time.Time         // image and file times (SOURCE_DATE_EPOCH)
	CACerts  string            // CA bundle to ship ("" none)
	Source   string            // org.opencontainers.image.source, "" none
}

// Labels are the OCI annotations of the image config. The project states
// no licence and no public URL, so the image claims none; source is set
// only when given (--source).
func Labels(o Options) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       o.Name,
		"org.opencontainers.image.description": Roles[o.Name].Description,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.created":     o.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.vendor":      "Forgeyard",
	}
	if o.Source != "" {
		l["org.opencontainers.image.source"] = o.Source
	}
	return l
}

// tarEntry is one file of a layer.
type tarEntry struct {
	name string // without a leading slash
	mode int64
	dir  bool
	uid  int
	data []byte
}

func layer(entries []tarEntry, created time.Time) (v1.Layer, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// baseLayer: the user, CA certificates, /tmp and the state directory.
func baseLayer(o Options) (v1.Layer, error) {
	id := strconv.Itoa(UID)
	entries := []tarEntry{
		{name: "etc", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" + UserName + ":x:" + id + ":" + id + ":" + UserName + ":" + StateDir + ":/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\n" + UserName + ":x:" + id + ":\n")},
		{name: "etc/forgeyard", mode: 0o755, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
		{name: "var", mode: 0o755, dir: true},
		{name: "var/lib", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(StateDir, "/"), mode: 0o700, dir: true, uid: UID},
	}
	if o.CACerts != "" {
		b, err := os.ReadFile(o.CACerts)
		if err != nil {
			return nil, err
		}
		entries = append(entries, tarEntry{name: "etc/ssl", mode: 0o755, dir: true}, tarEntry{name: "etc/ssl/certs", mode: 0o755, dir: true},
			tarEntry{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: b})
	}
	return layer(entries, o.Created)
}

// Image builds the image of o.Name for one platform from binary.
func Image(o Options, platform, binary string) (v1.Image, error) {
	role, ok := Roles[o.Name]
	if !ok {
		return nil, fmt.Errorf("no image for %q (want one of forgeyard-daemon, forgeyard-agent, forgeyard-relay)", o.Name)
	}
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok || osName != "linux" {
		return nil, fmt.Errorf("platform %q: want linux/ARCH", platform)
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	base, err := baseLayer(o)
	if err != nil {
		return nil, err
	}
	dirs := []tarEntry{{name: "usr", mode: 0o755, dir: true}, {name: "usr/local", mode: 0o755, dir: true}, {name: "usr/local/bin", mode: 0o755, dir: true}}
	app, err := layer(append(dirs, tarEntry{name: strings.TrimPrefix(BinDir, "/") + "/" + o.Name, mode: 0o755, data: bin}), o.Created)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range []v1.Layer{base, app} {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "mkimage " + o.Name}}); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = osName, arch, v1.Time{Time: o.Created}
	cf.Config.Entrypoint = []string{BinDir + "/" + o.Name}
	cf.Config.Cmd = role.Cmd
	cf.Config.User = strconv.Itoa(UID) + ":" + strconv.Itoa(UID)
	cf.Config.WorkingDir = StateDir
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = Labels(o)
	cf.Config.ExposedPorts = map[string]struct{}{}
	for _, p := range role.Ports {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	cf.Config.StopSignal = "SIGTERM"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: o.Created})
}

// Index builds every platform's image under one OCI image index.
func Index(o Options) (v1.ImageIndex, error) {
	platforms := make([]string, 0, len(o.Binaries))
	for p := range o.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	if len(platforms) == 0 {
		return nil, errors.New("no --binary given")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		img, err := Image(o, p, o.Binaries[p])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		osName, arch, _ := strings.Cut(p, "/")
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform:    &v1.Platform{OS: osName, Architecture: arch},
			Annotations: map[string]string{"org.opencontainers.image.ref.name": o.Version}}})
	}
	return mutate.AppendManifests(idx, adds...), nil
}

// WriteLayoutTar writes idx as an OCI image layout (oci-layout,
// index.json, blobs/) into the tar file out, its entries in a fixed order
// with the times of created.
func WriteLayoutTar(idx v1.ImageIndex, out string, created time.Time, refName string) error {
	dir, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName})); err != nil {
		return err
	}
	var files []string
	if err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files = append(files, path)
		}
		return err
	}); err != nil {
		return err
	}
	sort.Strings(files)
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Close()
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if err := tw.WriteHeader(&tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(b)), ModTime: created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(b); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

type binFlag map[string]string

func (b binFlag) String() string { return fmt.Sprint(map[string]string(b)) }
func (b binFlag) Set(s string) error {
	p, file, ok := strings.Cut(s, "=")
	if !ok || p == "" || file == "" {
		return errors.New("want PLATFORM=FILE, e.g. linux/amd64=out/forgeyard-daemon")
	}
	b[p] = file
	return nil
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	o := Options{Binaries: binFlag{}}
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Name, "name", "", "binary `name`: forgeyard-daemon, forgeyard-agent or forgeyard-relay")
	fs.Var(binFlag(o.Binaries), "binary", "`PLATFORM=FILE`, repeatable: the static binary for linux/amd64, linux/arm64, ...")
	fs.StringVar(&o.Version, "version", "devel", "image `version` (label and index ref name)")
	fs.StringVar(&o.Revision, "revision", "", "VCS `commit` (label)")
	fs.StringVar(&o.Source, "source", "", "`URL` of the source repository (label org.opencontainers.image.source; default none)")
	fs.StringVar(&o.CACerts, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "CA bundle `file` to ship in the image (\"\": none)")
	epoch := fs.Int64("source-date-epoch", 0, "image and file times, seconds since 1970 (default $SOURCE_DATE_EPOCH, else 0)")
	out := fs.String("out", "", "OCI layout tarball `file` to write")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "mkimage"); !ok {
		return code
	}
	if *epoch == 0 {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				*epoch = n
			}
		}
	}
	o.Created = time.Unix(*epoch, 0).UTC()
	if *out == "" || o.Name == "" {
		fmt.Fprintln(stderr, "mkimage: --name and --out are required")
		return cli.ExitUsage
	}
	if o.CACerts != "" {
		if _, err := os.Stat(o.CACerts); err != nil {
			fmt.Fprintf(stderr, "mkimage: --ca-certificates: %v (give --ca-certificates \"\" for an image without)\n", err)
			return cli.ExitUsage
		}
	}
	idx, err := Index(o)
	if err != nil {
		fmt.Fprintf(stderr, "mkimage: %v\n", err)
		return cli.ExitFail
	}
	if err := WriteLayoutTar(idx, *out, o.Created, o.Version); err != nil {
		fmt.Fprintf(stderr, "mkimage: %v\n", err)
		return cli.ExitFail
	}
	d, _ := idx.Digest()
	fmt.Fprintf(stdout, "%s: %s %s (%d platforms)\n", *out, o.Name, d, len(o.Binaries))
	return cli.ExitOK
}
