package postcard

import (
	"log/slog"
	"strconv"
)

// Code classifies a decoding failure. The values are stable; each maps onto
// the postcard crate's error variant of the same meaning (see RustName).
type Code uint8

// Decoding failure codes.
const (
	CodeUnexpectedEnd   Code = 1  // input ended before the value was complete
	CodeBadVarint       Code = 2  // varint longer than its type allows or with bits above its width
	CodeBadBool         Code = 3  // bool byte other than 0 or 1
	CodeBadOption       Code = 4  // option tag other than 0 or 1
	CodeBadUTF8         Code = 5  // string payload is not valid UTF-8
	CodeBadChar         Code = 6  // char length 0 or above 4, or its payload is not one valid char
	CodeBadEnum         Code = 7  // enum discriminant with no variant
	CodeLengthOverBound Code = 8  // a length or count above the field's declared bound
	CodeTrailingBytes   Code = 9  // bytes left over after a complete value
	CodeInvalidValue    Code = 10 // a well-formed value that the type's rules reject
)

var codeNames = [...]string{
	CodeUnexpectedEnd:   "unexpected end of input",
	CodeBadVarint:       "bad varint",
	CodeBadBool:         "bad bool",
	CodeBadOption:       "bad option tag",
	CodeBadUTF8:         "bad UTF-8",
	CodeBadChar:         "bad char",
	CodeBadEnum:         "unknown enum discriminant",
	CodeLengthOverBound: "length over bound",
	CodeTrailingBytes:   "trailing bytes",
	CodeInvalidValue:    "invalid value",
}

// String returns the code's Go name, or "postcard code n" for an undefined value; RustName gives the Rust crate's name.
func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return "postcard code " + strconv.Itoa(int(c))
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c Code) LogValue() slog.Value { return slog.StringValue(c.String()) }

// RustName returns the Debug name of the postcard crate's error variant that
// corresponds to c, for comparison with vectors produced by the Rust crate.
// Codes with no Rust counterpart (Rust does not bound lengths or reject
// trailing bytes) return "".
func (c Code) RustName() string {
	switch c {
	case CodeUnexpectedEnd:
		return "DeserializeUnexpectedEnd"
	case CodeBadVarint:
		return "DeserializeBadVarint"
	case CodeBadBool:
		return "DeserializeBadBool"
	case CodeBadOption:
		return "DeserializeBadOption"
	case CodeBadUTF8:
		return "DeserializeBadUtf8"
	case CodeBadChar:
		return "DeserializeBadChar"
	case CodeBadEnum, CodeInvalidValue:
		return "SerdeDeCustom"
	}
	return ""
}

// Error is a decoding error. Errors compare by Code with errors.Is against the
// Err* sentinels: errors.Is(err, postcard.ErrBadVarint).
type Error struct {
	Code   Code
	Offset int    // byte offset in the input where the failing item started
	Detail string // optional static detail: the field or the bound, never input bytes
}

// Error gives the code, the detail when present and the input offset when known.
func (e *Error) Error() string {
	s := "postcard: " + e.Code.String()
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	if e.Offset >= 0 {
		s += " at offset " + strconv.Itoa(e.Offset)
	}
	return s
}

// Is reports whether target is an *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrUnexpectedEnd   = &Error{Code: CodeUnexpectedEnd, Offset: -1}
	ErrBadVarint       = &Error{Code: CodeBadVarint, Offset: -1}
	ErrBadBool         = &Error{Code: CodeBadBool, Offset: -1}
	ErrBadOption       = &Error{Code: CodeBadOption, Offset: -1}
	ErrBadUTF8         = &Error{Code: CodeBadUTF8, Offset: -1}
	ErrBadChar         = &Error{Code: CodeBadChar, Offset: -1}
	ErrBadEnum         = &Error{Code: CodeBadEnum, Offset: -1}
	ErrLengthOverBound = &Error{Code: CodeLengthOverBound, Offset: -1}
	ErrTrailingBytes   = &Error{Code: CodeTrailingBytes, Offset: -1}
	ErrInvalidValue    = &Error{Code: CodeInvalidValue, Offset: -1}
)
