// Package config holds the TOML configuration of forgeyard-daemon and
// forgeyard-agent: the file formats, their defaults, loading and validation.
//
// The formats follow the spec's examples (§280–283) translated to TOML.
// Secrets are always file references: a key that names a certificate, a
// private key or a DSN holds a path, and a value that looks like inline PEM
// or key material is rejected (§283). Endpoint URIs are normalized (§282):
// "quic://host", "yamux://host:7444", "webtransport://host" and their aliases
// all become an Endpoint with a canonical scheme and an explicit port.
//
// Errors: Load* return a *Error naming the offending key (for example
// "timing.lease_ttl") and the problem; decoding errors name the file, line and
// key. Unknown keys are errors, so a typo never silently falls back to a
// default.
//
// The zero value of every optional field means "use the default" and the
// defaults are documented next to each field and in docs/operations.md.
package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"forgeyard.dev/transport/wire"
)

// MaxFileSize bounds a configuration file; larger files are rejected before
// parsing.
const MaxFileSize = 1 << 20

// ErrInvalid is what every validation *Error unwraps to.
var ErrInvalid = errors.New("config: invalid configuration")

// Error reports one problem with one configuration key.
type Error struct {
	File string // the file, or "" for a configuration built in code
	Key  string // dotted TOML key, e.g. "tls.private_key"
	Msg  string // what is wrong and, where possible, how to fix it
}

// Error implements error: "FILE: KEY: MSG".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

func invalid(key, format string, args ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Duration is a time.Duration written in TOML as a Go duration string
// ("10s", "1m30s", "250ms"). The zero value means "default".
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string. Negative durations are rejected.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("not a duration (want e.g. \"10s\", \"250ms\"): %q", b)
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", b)
	}
	d.Duration = v
	return nil
}

// MarshalText writes the duration in Go syntax.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

// Version is a protocol version written either as a string "MAJOR.MINOR"
// or as a table {major = 1, minor = 0} (the spec's example form, §280).
// The zero value (0.0) means "default".
type Version struct{ wire.ProtocolVersion }

// UnmarshalTOML accepts "1.0" or {major = 1, minor = 0}.
func (v *Version) UnmarshalTOML(data any) error {
	switch x := data.(type) {
	case string:
		maj, min, ok := strings.Cut(x, ".")
		if !ok {
			return fmt.Errorf("protocol version %q: want \"MAJOR.MINOR\"", x)
		}
		a, err1 := strconv.ParseUint(maj, 10, 16)
		b, err2 := strconv.ParseUint(min, 10, 16)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("protocol version %q: want \"MAJOR.MINOR\" with numbers 0–65535", x)
		}
		v.ProtocolVersion = wire.V(uint16(a), uint16(b))
		return nil
	case map[string]any:
		var out [2]uint16
		for k, val := range x {
			i := 0
			switch k {
			case "major":
			case "minor":
				i = 1
			default:
				return fmt.Errorf("protocol version: unknown key %q (want major, minor)", k)
			}
			n, ok := val.(int64)
			if !ok || n < 0 || n > 65535 {
				return fmt.Errorf("protocol version: %s must be an integer 0–65535", k)
			}
			out[i] = uint16(n)
		}
		v.ProtocolVersion = wire.V(out[0], out[1])
		return nil
	default:
		return fmt.Errorf("protocol version: want \"MAJOR.MINOR\" or {major, minor}, got %T", data)
	}
}

// IsZero reports whether v is 0.0 (unset).
func (v Version) IsZero() bool { return v.ProtocolVersion == wire.ProtocolVersion{} }

// Logging selects the slog handler of a command.
type Logging struct {
	// Level is debug, info, warn or error ("": info).
	Level string `toml:"level"`
	// Format is text or json ("": text).
	Format string `toml:"format"`
}

func (l *Logging) validate(prefix string) error {
	switch strings.ToLower(l.Level) {
	case "", "debug", "info", "warn", "warning", "error":
	default:
		return invalid(prefix+"level", "unknown level %q (want debug, info, warn or error)", l.Level)
	}
	switch strings.ToLower(l.Format) {
	case "", "text", "json":
	default:
		return invalid(prefix+"format", "unknown format %q (want text or json)", l.Format)
	}
	return nil
}

// read reads and decodes the file at path into a new T (a role's
// configuration), without defaults or validation.
func read[T any](path string) (*T, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := decode(path, data, v); err != nil {
		return nil, err
	}
	return v, nil
}

// load is parse on the file at path.
func load[T any, P roleConfig[T]](path string) (*T, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parse[T, P](path, data)
}

// parse decodes data into a new T, applies the defaults and validates;
// file labels the errors.
func parse[T any, P roleConfig[T]](file string, data []byte) (*T, error) {
	v := new(T)
	if err := decode(file, data, v); err != nil {
		return nil, err
	}
	P(v).ApplyDefaults()
	if err := P(v).Validate(); err != nil {
		return nil, withFile(err, file)
	}
	return v, nil
}

// roleConfig is a pointer to a role's configuration (*Agent, *Daemon,
// *Relay).
type roleConfig[T any] interface {
	*T
	ApplyDefaults()
	Validate() error
}

// Each role's file, one instantiation of load, read and parse per role.
// LoadX reads, parses, defaults and validates (ApplyDefaults, Validate)
// the file; errors are *Error values naming the file and key. ReadX reads
// and parses it without applying defaults or validating, for callers that
// override keys (command flags) before calling ApplyDefaults and Validate
// (cli.LoadConfig). ParseX is LoadX on bytes; file only labels errors.
// The signer's file has ReadSigner only (forgeyard-signer is its one
// reader).
var (
	LoadDaemon, ReadDaemon, ParseDaemon = load[Daemon], read[Daemon], parse[Daemon]
	LoadAgent, ReadAgent, ParseAgent    = load[Agent], read[Agent], parse[Agent]
	LoadRelay, ReadRelay, ParseRelay    = load[Relay], read[Relay], parse[Relay]
	ReadSigner                          = read[Signer]
)

// readFile reads a configuration file with the size bound.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if st.IsDir() {
		return nil, &Error{File: path, Msg: "is a directory, want a TOML file"}
	}
	if st.Size() > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is %d bytes, larger than the %d-byte limit", st.Size(), MaxFileSize)}
	}
	buf := make([]byte, st.Size()+1)
	n, err := f.Read(buf)
	if err != nil && n == 0 && st.Size() > 0 {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	if n > MaxFileSize {
		return nil, &Error{File: path, Msg: "file grew beyond the size limit while reading"}
	}
	return buf[:n], nil
}

// decode parses TOML into v and rejects unknown keys.
func decode(file string, data []byte, v any) error {
	md, err := toml.Decode(string(data), v)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return &Error{File: file, Key: pe.LastKey, Msg: fmt.Sprintf("line %d: %s", pe.Position.Line, pe.Message)}
		}
		msg := err.Error()
		var key string
		// Type mismatches: `toml: line 1 (last key "id"): incompatible types: ...`
		if _, rest, ok := strings.Cut(msg, `(last key "`); ok {
			if k, after, ok := strings.Cut(rest, `"): `); ok {
				key, msg = k, after
			}
		}
		return &Error{File: file, Key: key, Msg: msg}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, 0, len(und))
		for _, k := range und {
			keys = append(keys, k.String())
		}
		return &Error{File: file, Key: keys[0], Msg: fmt.Sprintf("unknown key (all unknown: %s)", strings.Join(keys, ", "))}
	}
	return nil
}

func withFile(err error, file string) error {
	var ce *Error
	if errors.As(err, &ce) && ce.File == "" {
		c := *ce
		c.File = file
		return &c
	}
	return err
}

// checkFileRef rejects values that are inline secrets rather than paths
// (§283): PEM blocks, anything multi-line, and "Secret(...)"-style
// references this build cannot resolve. An empty value is allowed here;
// required-ness is checked by the caller.
func checkFileRef(key, v string) error {
	if v == "" {
		return nil
	}
	if strings.Contains(v, "-----BEGIN") || strings.Contains(v, "PRIVATE KEY") {
		return invalid(key, "holds inline PEM; secrets are configured by file reference only (§283): put the PEM in a file (mode 0600 for keys) and give its path")
	}
	if strings.ContainsAny(v, "\n\r\x00") {
		return invalid(key, "must be a file path, not multi-line content (secrets are file references, §283)")
	}
	if strings.HasPrefix(v, "Secret(") {
		return invalid(key, "secret-store references are not supported; give a file path")
	}
	if len(v) > 4096 {
		return invalid(key, "path longer than 4096 bytes")
	}
	return nil
}

// SlogLevel returns the slog level of l ("" and unknown: info).
func (l Logging) SlogLevel() slog.Level {
	switch strings.ToLower(l.Level) {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// NewLogger returns a slog logger writing to w in l's format and level.
func (l Logging) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if strings.EqualFold(l.Format, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Validate checks Level and Format.
func (l Logging) Validate() error { return l.validate("log.") }

// WithFile returns err with File set to file when err is an *Error without
// one (for validation after ReadDaemon/ReadAgent and overrides).
func WithFile(err error, file string) error { return withFile(err, file) }
