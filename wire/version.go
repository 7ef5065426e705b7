package wire

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"forgeyard.dev/transport/wire/postcard"
)

// ProtocolVersion is a protocol version (§23). Major versions break
// semantics; minor versions extend them compatibly (§26–27).
type ProtocolVersion struct {
	Major uint16
	Minor uint16
}

// V returns ProtocolVersion{major, minor}.
func V(major, minor uint16) ProtocolVersion { return ProtocolVersion{major, minor} }

// Current is the highest protocol version this build speaks.
var Current = ProtocolVersion{Major: 1, Minor: 3}

// Supported is the protocol range this build supports.
var Supported = ProtocolRange{Min: ProtocolVersion{1, 0}, Max: Current}

// String returns the version as major.minor, e.g. 1.2.
func (v ProtocolVersion) String() string {
	return strconv.Itoa(int(v.Major)) + "." + strconv.Itoa(int(v.Minor))
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (v ProtocolVersion) LogValue() slog.Value { return slog.StringValue(v.String()) }

// Less reports whether v orders before w.
func (v ProtocolVersion) Less(w ProtocolVersion) bool {
	return v.Major < w.Major || (v.Major == w.Major && v.Minor < w.Minor)
}

// AppendPostcard appends v as {major: u16, minor: u16}.
func (v ProtocolVersion) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU16(b, v.Major)
	return postcard.AppendU16(b, v.Minor)
}

// DecodePostcard reads v.
func (v *ProtocolVersion) DecodePostcard(d *postcard.Decoder) {
	v.Major = d.U16()
	v.Minor = d.U16()
}

// ProtocolRange is an inclusive range of supported versions (§24).
type ProtocolRange struct {
	Min ProtocolVersion
	Max ProtocolVersion
}

// String returns the range as min–max, e.g. 1.0–1.2.
func (r ProtocolRange) String() string { return r.Min.String() + "–" + r.Max.String() }

// Contains reports whether v lies in r.
func (r ProtocolRange) Contains(v ProtocolVersion) bool {
	return !v.Less(r.Min) && !r.Max.Less(v)
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r ProtocolRange) LogValue() slog.Value { return slog.StringValue(r.String()) }

// Valid reports whether Min <= Max.
func (r ProtocolRange) Valid() bool { return !r.Max.Less(r.Min) }

// AppendPostcard appends r as {min, max}.
func (r ProtocolRange) AppendPostcard(b []byte) []byte {
	b = r.Min.AppendPostcard(b)
	return r.Max.AppendPostcard(b)
}

// DecodePostcard reads r.
func (r *ProtocolRange) DecodePostcard(d *postcard.Decoder) {
	r.Min.DecodePostcard(d)
	r.Max.DecodePostcard(d)
}

// NegotiationError reports that two ranges share no version. Its message
// names both ranges so an operator can act on it (§252–254).
type NegotiationError struct {
	Server ProtocolRange
	Agent  ProtocolRange
}

// Error names both ranges that have no version in common.
func (e *NegotiationError) Error() string {
	return fmt.Sprintf("no common protocol version: server supports %s, agent supports %s", e.Server, e.Agent)
}

// Negotiate returns the highest version supported by both server and agent
// (§25). Versions of different majors are never compatible: the result is
// the highest version that lies in both ranges. When none does it returns a
// *NegotiationError naming both ranges.
func Negotiate(server, agent ProtocolRange) (ProtocolVersion, error) {
	if !server.Valid() || !agent.Valid() {
		return ProtocolVersion{}, &NegotiationError{Server: server, Agent: agent}
	}
	hi := server.Max
	if agent.Max.Less(hi) {
		hi = agent.Max
	}
	lo := server.Min
	if lo.Less(agent.Min) {
		lo = agent.Min
	}
	if hi.Less(lo) {
		return ProtocolVersion{}, &NegotiationError{Server: server, Agent: agent}
	}
	return hi, nil
}

// ParseVersion parses "MAJOR.MINOR" (decimal, each 0–65535).
func ParseVersion(s string) (ProtocolVersion, error) {
	maj, min, ok := strings.Cut(s, ".")
	if !ok {
		return ProtocolVersion{}, fmt.Errorf("protocol version %q: want MAJOR.MINOR", s)
	}
	a, err1 := strconv.ParseUint(maj, 10, 16)
	b, err2 := strconv.ParseUint(min, 10, 16)
	if err1 != nil || err2 != nil {
		return ProtocolVersion{}, fmt.Errorf("protocol version %q: want MAJOR.MINOR with numbers 0–65535", s)
	}
	return V(uint16(a), uint16(b)), nil
}

// ParseRange parses "MIN-MAX" (for example "1.0-1.1"; the en dash that
// String prints is accepted too) or a single "MAJOR.MINOR" meaning that
// version only. The result is Valid or an error is returned.
func ParseRange(s string) (ProtocolRange, error) {
	lo, hi, ok := strings.Cut(strings.ReplaceAll(s, "–", "-"), "-")
	if !ok {
		hi = lo
	}
	min, err := ParseVersion(strings.TrimSpace(lo))
	if err != nil {
		return ProtocolRange{}, err
	}
	max, err := ParseVersion(strings.TrimSpace(hi))
	if err != nil {
		return ProtocolRange{}, err
	}
	r := ProtocolRange{Min: min, Max: max}
	if !r.Valid() {
		return ProtocolRange{}, fmt.Errorf("protocol range %q: minimum above maximum", s)
	}
	return r, nil
}
