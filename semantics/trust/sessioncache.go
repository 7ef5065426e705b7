package trust

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"sync"
)

// SessionCacheSize is the number of TLS sessions an agent keeps (one per
// daemon server name it dials; a few suffice).
const SessionCacheSize = 64

// NewSessionCache returns an agent's TLS client session cache (issue 25
// item 4): the daemon's session tickets are kept in memory so that a
// reconnection resumes the TLS session instead of a full certificate
// handshake. It is bound to the certificate current returns: a session
// resumes only while that certificate is the one in use when the session
// was stored. When it changes (a renewal, §21) the cache starts empty, since
// a resumed session would carry the old certificate's identity to the
// daemon. Give each agent its own cache (share it across that agent's
// dialers: tls.Config.Clone keeps it), never one across agents. A nil
// current binds the cache to no certificate.
func NewSessionCache(current func() *x509.Certificate) tls.ClientSessionCache {
	if current == nil {
		current = func() *x509.Certificate { return nil }
	}
	return &sessionCache{current: current}
}

type sessionCache struct {
	current func() *x509.Certificate
	mu      sync.Mutex
	leaf    []byte // DER of the certificate the cached sessions belong to
	lru     tls.ClientSessionCache
}

// cache returns the LRU of the current certificate, replacing it when the
// certificate changed.
func (c *sessionCache) cache() tls.ClientSessionCache {
	var der []byte
	if leaf := c.current(); leaf != nil {
		der = leaf.Raw
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru == nil || !bytes.Equal(der, c.leaf) {
		c.lru, c.leaf = tls.NewLRUClientSessionCache(SessionCacheSize), der
	}
	return c.lru
}

func (c *sessionCache) Get(key string) (*tls.ClientSessionState, bool) { return c.cache().Get(key) }

func (c *sessionCache) Put(key string, cs *tls.ClientSessionState) { c.cache().Put(key, cs) }
