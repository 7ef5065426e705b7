package signing

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU64    = 10                      // u64 varint
	sizeEnum   = 1                       // enum discriminant below 128
	sizeDigest = 32                      // [u8;32]
	sizeRef    = sizeEnum + 32 + sizeU64 // CasObjectRef
)

// sizeBytes is the largest encoding of a string or bytes of at most max bytes.
func sizeBytes(max int) int { return postcard.UvarintLen(uint64(max)) + max }

var (
	sizePolicy  = sizeBytes(MaxPolicyID) + sizeBytes(MaxAttestation) + 2*sizeU64
	sizeRequest = sizeBytes(MaxKeyRef) + sizeEnum + sizeDigest +
		postcard.UvarintLen(MaxMaterialRefs) + MaxMaterialRefs*sizeRef + sizePolicy
	sizeSigned   = sizeEnum + sizeBytes(MaxSignature) + postcard.UvarintLen(MaxChain) + MaxChain*sizeBytes(MaxChainCert)
	sizeRejected = sizeEnum + sizeBytes(MaxReason)
)

// Messages registers the signing family.
var Messages = []wire.MessageInfo{
	{Type: MsgSignRequest, Name: "signing.SignRequestV1", Since: wire.V(1, 0),
		MaxSize: sizeRequest,
		New:     func() wire.Message { return new(SignRequestV1) }},
	{Type: MsgSignResponse, Name: "signing.SignResponseV1", Since: wire.V(1, 0),
		MaxSize: max(sizeSigned, sizeRejected),
		New:     func() wire.Message { return new(SignResponseV1) }},
}
