package adminapi

import (
	"encoding/json"

	"forgeyard.dev/transport/wire"
)

// Version is a protocol version as numbers. Every JSON object here that
// carries a version string ("1.2") carries this form beside it
// (protocol_version, min_version, …), so a machine reading the JSON
// compares numbers instead of parsing text.
type Version struct {
	Major uint16 `json:"major"`
	Minor uint16 `json:"minor"`
}

// versionOf parses a version string; nil when it is empty or not a
// version (the numeric field is then omitted).
func versionOf(s string) *Version {
	v, err := wire.ParseVersion(s)
	if err != nil {
		return nil
	}
	return &Version{Major: v.Major, Minor: v.Minor}
}

// The MarshalJSON methods below look alike but each must embed its own
// plain copy of its type (Go cannot embed a type parameter, so no generic
// one can add the fields).

// MarshalJSON adds protocol_version.
func (s Session) MarshalJSON() ([]byte, error) {
	type plain Session
	return json.Marshal(struct {
		plain
		ProtocolVersion *Version `json:"protocol_version,omitempty"`
	}{plain(s), versionOf(s.Protocol)})
}

// MarshalJSON adds protocol_version.
func (r Runner) MarshalJSON() ([]byte, error) {
	type plain Runner
	return json.Marshal(struct {
		plain
		ProtocolVersion *Version `json:"protocol_version,omitempty"`
	}{plain(r), versionOf(r.Protocol)})
}

// MarshalJSON adds min_version and max_version.
func (r Range) MarshalJSON() ([]byte, error) {
	type plain Range
	return json.Marshal(struct {
		plain
		MinVersion *Version `json:"min_version,omitempty"`
		MaxVersion *Version `json:"max_version,omitempty"`
	}{plain(r), versionOf(r.Min), versionOf(r.Max)})
}

// MarshalJSON adds protocol_version.
func (v VersionCount) MarshalJSON() ([]byte, error) {
	type plain VersionCount
	return json.Marshal(struct {
		plain
		ProtocolVersion *Version `json:"protocol_version,omitempty"`
	}{plain(v), versionOf(v.Protocol)})
}

// MarshalJSON adds min_protocol_version.
func (p Protocols) MarshalJSON() ([]byte, error) {
	type plain Protocols
	return json.Marshal(struct {
		plain
		MinProtocolVersion *Version `json:"min_protocol_version,omitempty"`
	}{plain(p), versionOf(p.MinProtocol)})
}
