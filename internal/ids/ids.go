// Package ids makes the identifiers of llmq's objects: a type prefix, then a
// ULID in lower case (26 characters of Crockford base32, the first 10 the
// creation time in milliseconds, the rest 80 random bits). Ids of one type
// therefore sort in creation order, which cursor pagination relies on.
package ids

import (
	"crypto/rand"
	"strings"
	"sync"

	"github.com/oklog/ulid/v2"
)

// Prefixes of the object types, as OpenAI spells them where OpenAI has the type.
const (
	Job    = "job_"
	Batch  = "batch_"
	File   = "file-"
	Tenant = "ten_"
	Key    = "key_"
	// BatchPart is a part of a batch offloaded to a provider's Batch API.
	BatchPart = "bpart_"
)

var alphabet = strings.ToLower(ulid.Encoding)

// monotonic orders the ids New makes in this process: an id made in the
// same millisecond as the one before, or while the clock stepped back, takes
// that id's time and its random part plus one.
var monotonic = struct {
	sync.Mutex
	ms      uint64
	entropy *ulid.MonotonicEntropy
}{entropy: ulid.Monotonic(rand.Reader, 1)}

// New returns a new id of the type prefix, stamped with the current time,
// after every id New made before in this process.
func New(prefix string) string {
	monotonic.Lock()
	defer monotonic.Unlock()
	monotonic.ms = max(monotonic.ms, ulid.Now())
	id, err := ulid.New(monotonic.ms, monotonic.entropy)
	if err != nil {
		// The random part of this millisecond overflowed: the next one
		// starts a fresh random part.
		monotonic.ms++
		id = ulid.MustNew(monotonic.ms, monotonic.entropy)
	}
	return prefix + strings.ToLower(id.String())
}

// Valid reports whether id has the type prefix and a well-formed body.
func Valid(prefix, id string) bool {
	body, ok := strings.CutPrefix(id, prefix)
	return ok && len(body) == 26 && strings.Trim(body, alphabet) == ""
}
