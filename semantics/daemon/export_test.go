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

// SendToRunner writes m on the control stream of runner's current
// transport, as any daemon feature would (Channel.Send), so a test can
// show what the send path refuses. Test-only.
func SendToRunner(d *Daemon, runner wire.RunnerId, m wire.Message) error {
	c := d.runnerConn(runner)
	if c == nil || c.channel() == nil {
		return ErrNotConnected
	}
	_, err := c.channel().SendMsg(m)
	return err
}
