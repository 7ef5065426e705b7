package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/postcard"
)

// AdminAckV1 is the agent's answer to one admin command: whether it accepted
// it, and operator text (why not, or what it will do). The envelope's
// correlation id names the command's message.
//
//	struct AdminAckV1 {
//	    command: u16,      // the MessageTypeId of the acknowledged admin command
//	    accepted: bool,
//	    message: String,   // ≤ 256 bytes
//	}
//
// The Go field for `command` is Acked: the type number of the command, not a
// command line — this family has none (§98).
type AdminAckV1 struct {
	Acked    wire.MessageTypeId
	Accepted bool
	Message  string
}

// MessageType implements wire.Message.
func (*AdminAckV1) MessageType() wire.MessageTypeId { return MsgAdminAck }

// AppendPostcard implements wire.Message.
func (m *AdminAckV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU16(b, uint16(m.Acked))
	b = postcard.AppendBool(b, m.Accepted)
	return postcard.AppendString(b, m.Message)
}

// DecodePostcard implements wire.Message.
func (m *AdminAckV1) DecodePostcard(d *postcard.Decoder) {
	m.Acked = wire.MessageTypeId(d.U16())
	m.Accepted = d.Bool()
	m.Message = d.String(MaxText)
}

// Validate implements wire.Message: Acked must be an admin command (IsCommand)
// and Message at most MaxText bytes of UTF-8.
func (m *AdminAckV1) Validate() error {
	if !IsCommand(m.Acked) {
		return errInvalid("admin ack: acknowledged type is not an admin command")
	}
	if !check.Text(m.Message, MaxText, false) {
		return errInvalid("admin ack: message must be ≤ 256 bytes of UTF-8")
	}
	return nil
}
