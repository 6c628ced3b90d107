package api

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/store"
)

// KeyCache keeps the tenant keys this dispatcher authenticated recently, with
// their tenants. The admin API publishes every change to a key or tenant on
// a Redis channel, and every dispatcher's cache empties itself on the
// message. While the subscription is down the cache holds nothing (messages
// sent meanwhile are lost); entries also expire after keyCacheTTL, a
// backstop for a change made without the admin API. Only keys found are
// cached.
type KeyCache struct {
	rdb     redis.UniversalClient
	channel string
	opts    KeyCacheOptions
	ps      *redis.PubSub
	quit    chan struct{} // closed by Close
	done    chan struct{} // closed when loop returns

	mu sync.Mutex
	m  map[[32]byte]keyEntry
	// gen grows at every flush; an entry read from the store under an
	// older generation is not kept, so a lookup that raced a revocation
	// cannot put the revoked key back.
	gen uint64
	// live is false until the subscription is confirmed and after it
	// breaks: the cache neither answers nor keeps entries meanwhile.
	live bool
}

type keyEntry struct {
	key     *store.APIKey
	tenant  *store.Tenant
	expires time.Time
}

// A full cache (keyCacheMax entries) is emptied.
const (
	keyCacheTTL = 5 * time.Second
	keyCacheMax = 100_000
)

// KeyCacheOptions configure a KeyCache.
type KeyCacheOptions struct {
	// Now is the clock of the entries' expiry. Defaults to time.Now.
	Now func() time.Time
	// Logger is told when the subscription breaks. Defaults to none.
	Logger *slog.Logger
}

// NewKeyCache subscribes to channel (rkeys.Builder.KeyChanges) and returns
// the cache once the subscription is confirmed. Close it when done.
func NewKeyCache(ctx context.Context, rdb redis.UniversalClient, channel string, opts KeyCacheOptions) (*KeyCache, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &KeyCache{rdb: rdb, channel: channel, opts: opts, quit: make(chan struct{}), done: make(chan struct{}), m: make(map[[32]byte]keyEntry)}
	c.ps = rdb.Subscribe(ctx, channel)
	// The first reply confirms the subscription; Receive reconnects and
	// resubscribes on its own afterwards.
	msg, err := c.ps.Receive(ctx)
	if err != nil {
		_ = c.ps.Close()
		return nil, fmt.Errorf("api: subscribe to %s: %w", channel, err)
	}
	c.handle(msg)
	go c.loop()
	return c, nil
}

// Close ends the subscription.
func (c *KeyCache) Close() error {
	close(c.quit)
	err := c.ps.Close()
	<-c.done
	return err
}

func (c *KeyCache) loop() {
	defer close(c.done)
	for {
		msg, err := c.ps.Receive(context.Background())
		if err != nil {
			select {
			case <-c.quit:
				return
			default:
			}
			c.mu.Lock()
			wasLive := c.live
			c.flushLocked(false)
			c.mu.Unlock()
			if wasLive {
				c.opts.Logger.Warn("key cache: subscription lost; keys are read from the store until it is back", "err", err)
			}
			// Receive reconnects on the next call; do not spin while
			// Redis is away.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-c.quit:
				return
			}
			continue
		}
		c.handle(msg)
	}
}

func (c *KeyCache) handle(msg any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m := msg.(type) {
	case *redis.Subscription:
		// Subscribed, first or again after a reconnection: whatever was
		// published in between is lost, so start empty.
		c.flushLocked(m.Kind == "subscribe")
	case *redis.Message:
		c.flushLocked(c.live)
	}
}

func (c *KeyCache) flushLocked(live bool) {
	clear(c.m)
	c.gen++
	c.live = live
}

// get returns the cached key and tenant of hash, and the generation a
// lookup of the store must present to put.
func (c *KeyCache) get(hash [32]byte) (*store.APIKey, *store.Tenant, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	if !ok || !c.live {
		return nil, nil, c.gen, false
	}
	if !c.opts.Now().Before(e.expires) {
		delete(c.m, hash)
		return nil, nil, c.gen, false
	}
	return e.key, e.tenant, c.gen, true
}

// put keeps what the store answered for hash, unless a flush came since
// the lookup began (gen from get).
func (c *KeyCache) put(hash [32]byte, k *store.APIKey, t *store.Tenant, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen || !c.live {
		return
	}
	if len(c.m) >= keyCacheMax {
		clear(c.m)
	}
	c.m[hash] = keyEntry{key: k, tenant: t, expires: c.opts.Now().Add(keyCacheTTL)}
}

// Changed empties this cache and tells every other dispatcher's to. Call it
// after a key or a tenant changed in the store.
func (c *KeyCache) Changed(ctx context.Context) error {
	c.mu.Lock()
	c.flushLocked(c.live)
	c.mu.Unlock()
	if err := c.rdb.Publish(ctx, c.channel, "changed").Err(); err != nil {
		return fmt.Errorf("api: publish a key change: %w", err)
	}
	return nil
}
