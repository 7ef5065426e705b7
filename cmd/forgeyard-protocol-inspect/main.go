// Command forgeyard-protocol-inspect decodes Forgeyard wire frames and
// prints them for people: type names, identifiers as ULID strings, digests
// as hex, enums by name, nested structures indented, or all of it as JSON.
// JSON is lossless: a value that text shows in a short form (a CasObjectRef
// as "sha256:<hex>", a version as "1.2") appears there with every field.
//
// Usage:
//
//	forgeyard-protocol-inspect [--json] [--stream] (--hex HEX | --file FILE | -)
//	forgeyard-protocol-inspect registry [--json]
//	forgeyard-protocol-inspect vectors [--json] [DIR]
//
// The first form decodes one frame or a capture of concatenated frames
// (varint(len) ‖ envelope, see docs/protocols/internal/framing.md) from hex
// (whitespace and a leading 0x ignored), from a binary file, or from stdin
// ("-"). With --stream the capture is one whole stream: if its first frame
// parses as a StreamHeader it is shown as such and the stream kind's frame
// limit applies to the frames after it; on CAS streams only the first frame
// after the header is a message and the rest is counted as raw object bytes.
// Without --stream every frame must be an envelope.
//
// "registry" lists every registered message type. "vectors" decodes and
// prints every golden vector under DIR (default wire/vectors/testdata,
// relative to the working directory), checking each one as the tests do.
//
// Messages whose registry entry is Sensitive are never printed: the output
// shows "<redacted N bytes>" and the message's own (redacting) String form,
// in text and in JSON alike.
//
// Exit status: 0 on success, 1 when any input fails to decode or a vector
// fails its check, 2 on a usage error. Errors are one line on stderr.
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/vectors"
)

const prog = "forgeyard-protocol-inspect"

const usageText = `usage:
  forgeyard-protocol-inspect [--json] [--stream] (--hex HEX | --file FILE | -)
  forgeyard-protocol-inspect registry [--json]
  forgeyard-protocol-inspect vectors [--json] [DIR]
  forgeyard-protocol-inspect version [--json] | --version

Decodes Forgeyard wire frames (varint(len) ‖ envelope) and prints them.
  --hex HEX    frames as hex; whitespace and a leading 0x are ignored
  --file FILE  frames as raw bytes from FILE
  -            frames as raw bytes from stdin
  --stream     the input is a whole stream: try a StreamHeader frame first
  --json       print JSON instead of text
Sensitive messages are always redacted. Exit status: 0 ok, 1 decode failure, 2 usage.
`

// maxInput bounds what the inspector reads from a file or stdin.
const maxInput = 64 << 20

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole program, in-process testable.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{reg: registry.Default, stdin: stdin, stdout: stdout, stderr: stderr}
	return a.run(args)
}

type app struct {
	reg    *wire.Registry
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// usageError is a command-line mistake: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func (a *app) run(args []string) (code int) {
	defer func() {
		// The decoders are meant never to panic; should one, report it as a
		// decode failure rather than crash with a stack trace.
		if r := recover(); r != nil {
			fmt.Fprintf(a.stderr, "%s: internal error: %v\n", prog, r)
			code = 1
		}
	}()
	var err error
	switch {
	case len(args) > 0 && (args[0] == "version" || cli.IsVersionFlag(args[0])):
		code, _ := cli.VersionOnly(prog, args, a.stdout, a.stderr)
		return code
	case len(args) > 0 && args[0] == "registry":
		err = a.registryCmd(args[1:])
	case len(args) > 0 && args[0] == "vectors":
		err = a.vectorsCmd(args[1:])
	case len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help"):
		fmt.Fprint(a.stdout, usageText)
		return 0
	default:
		err = a.decodeCmd(args)
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "%s: %s (see %s --help)\n", prog, ue.msg, prog)
		return 2
	default:
		fmt.Fprintf(a.stderr, "%s: %s\n", prog, oneLine(err.Error()))
		return 1
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &usageError{"help requested"}
		}
		return &usageError{err.Error()}
	}
	return nil
}

// ---- decode ---------------------------------------------------------------

func (a *app) decodeCmd(args []string) error {
	fs := newFlags(prog)
	asJSON := fs.Bool("json", false, "")
	stream := fs.Bool("stream", false, "")
	hexIn := fs.String("hex", "", "")
	fileIn := fs.String("file", "", "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sources := 0
	if *hexIn != "" {
		sources++
	}
	if *fileIn != "" {
		sources++
	}
	stdinIn := false
	switch rest := fs.Args(); {
	case len(rest) == 1 && rest[0] == "-":
		stdinIn = true
		sources++
	case len(rest) > 0:
		return &usageError{fmt.Sprintf("unexpected argument %q", rest[0])}
	}
	if sources != 1 {
		return &usageError{"give exactly one input: --hex HEX, --file FILE or -"}
	}
	var data []byte
	var err error
	switch {
	case *hexIn != "":
		data, err = parseHex(*hexIn)
	case *fileIn != "":
		data, err = readFile(*fileIn)
	case stdinIn:
		data, err = readBounded(a.stdin, "stdin")
	}
	if err != nil {
		return err
	}
	res := decodeCapture(a.reg, data, *stream)
	if *asJSON {
		if err := writeJSON(a.stdout, res.json()); err != nil {
			return err
		}
	} else {
		res.writeText(a.stdout)
	}
	return res.err
}

func parseHex(s string) ([]byte, error) {
	s = strings.Join(strings.Fields(s), "")
	s = strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("invalid hex input: %v", err)
	}
	return b, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, path)
}

func readBounded(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxInput+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %v", name, err)
	}
	if len(b) > maxInput {
		return nil, fmt.Errorf("%s: input larger than %d bytes", name, maxInput)
	}
	return b, nil
}

// capture is the decoded form of one input.
type capture struct {
	streamHeader *wire.StreamHeader
	note         string // how the input was interpreted, when not obvious
	frames       []frameResult
	rawBytes     int // bytes after a CAS stream's header message
	err          error
}

type frameResult struct {
	offset int
	size   int // frame body bytes
	fields obj // decoded envelope and payload, as far as decoding got
	err    error
}

// decodeCapture splits data into frames and decodes each one. A malformed
// envelope fails that frame only: the length prefix still delimits the next
// one. A malformed or over-limit prefix ends the capture.
func decodeCapture(reg *wire.Registry, data []byte, stream bool) *capture {
	c := &capture{}
	limit := wire.MaxAnyFrame
	off := 0
	casStream := false
	for i := 0; off < len(data); i++ {
		body, n, err := nextFrame(data[off:], limit)
		if err != nil {
			c.err = fmt.Errorf("frame %d at offset %d: %w", i, off, err)
			return c
		}
		if i == 0 && stream {
			if h, err := wire.ParseStreamHeader(body); err == nil {
				c.streamHeader = &h
				limit = h.Kind.FrameLimit()
				casStream = h.Kind == wire.StreamCasUpload || h.Kind == wire.StreamCasDownload
				off += n
				continue
			}
			c.note = "first frame is not a StreamHeader; decoding it as an envelope"
		}
		fr := decodeFrame(reg, body)
		fr.offset = off
		fr.size = len(body)
		c.frames = append(c.frames, fr)
		if fr.err != nil && c.err == nil {
			c.err = fmt.Errorf("frame %d at offset %d: %w", len(c.frames)-1, off, fr.err)
		}
		off += n
		if casStream {
			c.rawBytes = len(data) - off
			return c
		}
	}
	if len(data) == 0 {
		c.err = errors.New("empty input: no frames")
	}
	return c
}

// nextFrame reads varint(len) ‖ body from b, checking len against limit and
// against the bytes present. n is the whole frame's size.
func nextFrame(b []byte, limit int) (body []byte, n int, err error) {
	d := postcard.NewDecoder(b)
	size := d.U64()
	if err := d.Err(); err != nil {
		return nil, 0, fmt.Errorf("length prefix: %w", err)
	}
	if size > uint64(limit) {
		return nil, 0, &wire.FrameTooLargeError{Size: size, Limit: limit}
	}
	p := d.Offset()
	if uint64(len(b)-p) < size {
		return nil, 0, fmt.Errorf("frame declares %d bytes, only %d present", size, len(b)-p)
	}
	return b[p : p+int(size)], p + int(size), nil
}

// decodeFrame decodes one envelope, keeping whatever decoded before an
// error so that the output shows how far it got.
func decodeFrame(reg *wire.Registry, body []byte) frameResult {
	var fr frameResult
	d := postcard.NewDecoder(body)
	var env wire.Envelope
	env.DecodeHeader(&d)
	if err := d.Err(); err != nil {
		fr.err = fmt.Errorf("envelope header: %w", err)
		return fr
	}
	fr.fields = envelopeFields(&env)
	payloadStart := d.Offset()
	m, err := reg.DecodeMessage(&d)
	if err != nil {
		var ue *wire.UnknownMessageError
		if errors.As(err, &ue) {
			fr.fields = append(fr.fields,
				kv{"type", textVal(ue.Type.String())},
				kv{"payload", textVal(fmt.Sprintf("<unknown message type, %d bytes>", len(body)-payloadStart))})
		}
		fr.err = fmt.Errorf("payload: %w", err)
		return fr
	}
	fr.fields = append(fr.fields, payloadFields(reg, m)...)
	return fr
}

func envelopeFields(e *wire.Envelope) obj {
	o := obj{
		{"protocol", tree(reflect.ValueOf(e.Protocol), 0)},
		{"message_id", textVal(e.MessageID.String())},
	}
	if e.HasCorrelation {
		o = append(o, kv{"correlation_id", textVal(e.CorrelationID.String())})
	} else {
		o = append(o, kv{"correlation_id", nil})
	}
	o = append(o, kv{"sent_at_ms", e.SentAtMs})
	if e.SentAtMs <= 1<<53 {
		o = append(o, kv{"sent_at", textVal(time.UnixMilli(int64(e.SentAtMs)).UTC().Format(time.RFC3339Nano))})
	}
	if e.HasTrace {
		o = append(o, kv{"trace", textVal(e.Trace.Traceparent())})
	} else {
		o = append(o, kv{"trace", nil})
	}
	return o
}

// payloadFields describes a decoded message. A Sensitive message is never
// walked: only its size and its own String form appear.
func payloadFields(reg *wire.Registry, m wire.Message) obj {
	mi, _ := reg.Lookup(m.MessageType())
	o := obj{
		{"type", textVal(mi.Type.String())},
		{"name", textVal(mi.Name)},
	}
	if mi.Sensitive {
		red := obj{{"redacted", textVal(fmt.Sprintf("<redacted %d bytes>", len(m.AppendPostcard(nil))))}}
		if s, ok := m.(fmt.Stringer); ok {
			red = append(red, kv{"summary", textVal(safeString(s))})
		}
		o = append(o, kv{"sensitive", true}, kv{"payload", red})
	} else {
		o = append(o, kv{"payload", tree(reflect.ValueOf(m), 0)})
	}
	if err := m.Validate(); err != nil {
		o = append(o, kv{"invalid", err.Error()})
	}
	return o
}

func safeString(s fmt.Stringer) (out string) {
	defer func() {
		if recover() != nil {
			out = "<String panicked>"
		}
	}()
	return s.String()
}

func (c *capture) json() obj {
	var o obj
	if c.streamHeader != nil {
		o = append(o, kv{"stream_header", obj{
			{"kind", enumVal{Name: c.streamHeader.Kind.String()}},
			{"version", tree(reflect.ValueOf(c.streamHeader.Version), 0)},
		}})
	}
	if c.note != "" {
		o = append(o, kv{"note", c.note})
	}
	frames := make([]any, 0, len(c.frames))
	for _, f := range c.frames {
		frames = append(frames, f.obj())
	}
	o = append(o, kv{"frames", frames})
	if c.rawBytes > 0 {
		o = append(o, kv{"raw_object_bytes", c.rawBytes})
	}
	if c.err != nil {
		o = append(o, kv{"error", oneLine(c.err.Error())})
	}
	return o
}

func (f frameResult) obj() obj {
	o := obj{{"offset", f.offset}, {"size", f.size}}
	o = append(o, f.fields...)
	if f.err != nil {
		o = append(o, kv{"error", oneLine(f.err.Error())})
	}
	return o
}

func (c *capture) writeText(w io.Writer) {
	if c.streamHeader != nil {
		fmt.Fprintf(w, "stream header: kind %s (%d), version %s\n", c.streamHeader.Kind, c.streamHeader.Kind, c.streamHeader.Version)
	}
	if c.note != "" {
		fmt.Fprintf(w, "note: %s\n", c.note)
	}
	for i, f := range c.frames {
		writeFrameText(w, fmt.Sprintf("frame %d (offset %d, %d bytes)", i, f.offset, f.size), f)
	}
	if c.rawBytes > 0 {
		fmt.Fprintf(w, "raw object bytes: %d (not shown)\n", c.rawBytes)
	}
}

func writeFrameText(w io.Writer, title string, f frameResult) {
	fmt.Fprintln(w, title)
	writeText(w, "  ", "", f.fields)
	if f.err != nil {
		fmt.Fprintf(w, "  error: %s\n", oneLine(f.err.Error()))
	}
}

func writeJSON(w io.Writer, v any) error {
	b, err := marshalJSON(v)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

// ---- registry -------------------------------------------------------------

func (a *app) registryCmd(args []string) error {
	fs := newFlags(prog + " registry")
	asJSON := fs.Bool("json", false, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	all := a.reg.All()
	if *asJSON {
		list := make([]any, 0, len(all))
		for _, mi := range all {
			list = append(list, obj{
				{"type", mi.Type.String()}, {"family", mi.Type.Family().String()}, {"name", textVal(mi.Name)},
				{"since", mi.Since.String()}, {"since_version", obj{{"major", mi.Since.Major}, {"minor", mi.Since.Minor}}},
				{"type_id", uint64(mi.Type)}, {"max_size", mi.MaxSize}, {"sensitive", mi.Sensitive},
			})
		}
		return writeJSON(a.stdout, list)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tFAMILY\tNAME\tSINCE\tMAX SIZE\tSENSITIVE")
	for _, mi := range all {
		sens := "no"
		if mi.Sensitive {
			sens = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", mi.Type, mi.Type.Family(), mi.Name, mi.Since, mi.MaxSize, sens)
	}
	return tw.Flush()
}

// ---- vectors --------------------------------------------------------------

func (a *app) vectorsCmd(args []string) error {
	fs := newFlags(prog + " vectors")
	asJSON := fs.Bool("json", false, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	root := vectors.DefaultDir
	switch fs.NArg() {
	case 0:
	case 1:
		root = fs.Arg(0)
	default:
		return &usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(1))}
	}
	dirs, err := vectors.VersionDirs(root)
	if err != nil {
		return fmt.Errorf("no golden vectors at %s: %v (run from the module root or pass DIR)", root, err)
	}
	if len(dirs) == 0 {
		return fmt.Errorf("no version directories (v<major>.<minor>) under %s", root)
	}
	var list []any
	var failed []string
	total := 0
	for _, dir := range dirs {
		files, err := vectors.ReadDir(dir)
		if err != nil {
			return err
		}
		released := ""
		if vectors.Released(dir) {
			released = ", released"
		}
		fams := make([]string, 0, len(files))
		for f := range files {
			fams = append(fams, f)
		}
		sort.Strings(fams)
		for _, fam := range fams {
			file := filepath.Join(filepath.Base(dir), fam+".json")
			if !*asJSON {
				fmt.Fprintf(a.stdout, "== %s (%d vectors%s)\n", file, len(files[fam]), released)
			}
			for _, v := range files[fam] {
				total++
				var fr frameResult
				_, checkErr := vectors.Check(v, a.reg)
				if frame, err := v.Frame(); err == nil {
					c := decodeCapture(a.reg, frame, false)
					if len(c.frames) == 1 {
						fr = c.frames[0]
					}
				}
				if checkErr != nil {
					fr.err = checkErr
					failed = append(failed, v.Name)
				}
				if *asJSON {
					list = append(list, obj{{"file", file}, {"vector", v.Name}, {"frame", fr.obj()}})
					continue
				}
				writeFrameText(a.stdout, fmt.Sprintf("-- %s (%s, frame %d bytes)", v.Name, v.Type, len(v.FrameHex)/2), fr)
			}
		}
	}
	if *asJSON {
		if err := writeJSON(a.stdout, list); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "%d vectors in %d version directories, %d failed\n", total, len(dirs), len(failed))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d golden vectors failed: %s", len(failed), total, strings.Join(failed, ", "))
	}
	return nil
}
