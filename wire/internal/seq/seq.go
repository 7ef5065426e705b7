// Package seq encodes and decodes the bounded Postcard sequences (Vec<T>)
// of the message families, the one way every family writes them:
//
//   - Append writes the element count, then each element.
//   - Decode reads the count, checks it against the field's bound, and
//     allocates at most what the remaining input can hold (postcard's
//     SeqCap and Resize). When the input cannot hold the declared count it
//     decodes one element more, which fails with that element's own error
//     as Rust's postcard reports it, and then records CodeUnexpectedEnd (a
//     no-op after that failure).
//
// The element functions are plain functions or method expressions such as
// (*ActiveAttemptV1).decodePostcard; nothing is boxed and nothing beyond the
// destination slice is allocated. The package is wire's own (no promise).
package seq

import (
	"iter"

	"forgeyard.dev/transport/wire/postcard"
)

// Append appends the sequence s: its length, then each element as enc
// appends it.
func Append[T any](b []byte, s []T, enc func(*T, []byte) []byte) []byte {
	b = postcard.AppendLen(b, len(s))
	for i := range s {
		b = enc(&s[i], b)
	}
	return b
}

// Decode reads the count of a sequence of at most max elements, each at
// least minElem bytes on the wire, sizes *s for it (reusing its capacity
// when it suffices) and yields a pointer to each element for the loop body
// to decode in place:
//
//	for a := range seq.Decode(d, &m.ActiveAttempts, MaxActiveAttempts, activeAttemptMinSize) {
//		a.decodePostcard(d)
//	}
//
// Reused elements keep their previous values, so the body must set every
// field. When the input cannot hold the declared count, *s holds what it
// can and Decode yields one scratch element more, whose decoding fails with
// its own error as Rust reports it, then records CodeUnexpectedEnd (a no-op
// after that failure). The body runs inline: no element decoder is boxed
// and nothing but *s is allocated.
func Decode[T any](d *postcard.Decoder, s *[]T, max, minElem int) iter.Seq[*T] {
	return func(yield func(*T) bool) {
		n := d.Len(max)
		*s = postcard.Resize(*s, d.SeqCap(n, minElem))
		for i := range *s {
			if !yield(&(*s)[i]) {
				return
			}
		}
		if len(*s) < n { // the input cannot hold n: the next element reports the error, as in Rust
			var next T
			yield(&next)
			d.Fail(postcard.CodeUnexpectedEnd, "count beyond input")
		}
	}
}

// AppendBytes appends a Vec<Bytes> (a certificate chain, for instance).
func AppendBytes(b []byte, list [][]byte) []byte {
	return Append(b, list, func(p *[]byte, b []byte) []byte { return postcard.AppendBytes(b, *p) })
}

// DecodeBytes reads a Vec<Bytes> of at most max elements of at most maxLen
// bytes each into a new slice (nil when empty); every element is a copy,
// never aliasing the input.
func DecodeBytes(d *postcard.Decoder, max, maxLen int) [][]byte {
	var list [][]byte
	for p := range Decode(d, &list, max, 1) {
		*p = d.Bytes(maxLen)
	}
	return list
}
