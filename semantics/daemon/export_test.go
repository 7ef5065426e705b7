package daemon

import "forgeyard.dev/transport/wire"

// SetOfferFilter makes d consult f before every LeaseOfferV1 it would send
// and drop the offer when f returns false, as if the network lost it. Nil
// removes the filter. Test-only.
func SetOfferFilter(d *Daemon, f func(wire.LeaseId) bool) {
	if f == nil {
		d.offerFilter.Store(nil)
		return
	}
	d.offerFilter.Store(&f)
}

// OfferMessageID exposes the MessageId every daemon uses for a lease's
// offers.
var OfferMessageID = offerMessageID
