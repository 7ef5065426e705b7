package signing

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var (
	sizePolicy  = maxsize.Bytes(MaxPolicyID) + maxsize.Bytes(MaxAttestation) + 2*maxsize.U64
	sizeRequest = maxsize.Bytes(MaxKeyRef) + maxsize.Enum + maxsize.Digest +
		maxsize.Seq(MaxMaterialRefs, maxsize.Ref) + sizePolicy
	sizeSigned   = maxsize.Enum + maxsize.Bytes(MaxSignature) + maxsize.Seq(MaxChain, maxsize.Bytes(MaxChainCert))
	sizeRejected = maxsize.Enum + maxsize.Bytes(MaxReason)
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
