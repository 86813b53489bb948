package kvdir

import "time"

// Result is one name's resolution: an address, or the error a resolve returns (not
// registered, bad value).
type Result struct {
	Addr string
	Err  error
	// Absent: the service said the key is not there (Err is then ErrNotFound's).
	Absent bool
}

// entry is a cached Result as of the read numbered seq; used: looked up since the last
// poll round.
type entry struct {
	res    Result
	seq    uint64
	used   bool
	picked uint64 // the poll round that last read it as used
	// gone: when polls started to find the key absent while res still holds its address.
	gone time.Time
}

// Cache is the pure part of a polled directory: which names are cached, which read's
// answer wins, and which names the next poll round reads. It does no I/O, holds no clock
// and starts nothing; the driver (Dir) locks it and feeds it the answers of its reads,
// each numbered by the order in which the reads started.
//
// Rules:
//   - A fetch (a resolve's read of an uncached name) inserts its answer; at the bound an
//     arbitrary other name makes room.
//   - A poll answer only updates a name still cached: a name evicted meanwhile stays out.
//   - An answer never replaces one from a read that started later (seq).
//   - A poll that finds the key of a cached address absent keeps the address until polls
//     have found it absent for grace: a service restarted empty is refilled by its
//     registrations' next refresh, and in between the names it held keep resolving. A
//     deleted name is thus seen within grace plus a poll period.
//   - A poll round reads the names looked up since they were last read, and up to sweep
//     of the others (in the map's order), so that an unused name is not stale for ever;
//     at most round names in all, so that a round stays bounded for a backend that reads
//     one key per request (a used name left out keeps its mark for a later round).
type Cache struct {
	max, sweep, round int
	grace             time.Duration
	rounds            uint64
	m                 map[string]*entry
}

// NewCache returns a cache of at most max names whose poll rounds read at most round
// names, of which at most sweep were not looked up since they were last read, and which
// keeps an address found absent for grace.
func NewCache(max, sweep, round int, grace time.Duration) *Cache {
	return &Cache{max: max, sweep: sweep, round: round, grace: grace, m: make(map[string]*entry)}
}

// Lookup returns name's cached result and marks it used.
func (c *Cache) Lookup(name string) (Result, bool) {
	e := c.m[name]
	if e == nil {
		return Result{}, false
	}
	e.used = true
	return e.res, true
}

// Store folds the answer of read seq, made at now, for name in. fetch: the read of a
// resolve, which inserts; otherwise a poll's, which only updates. It reports whether the
// answer was kept.
func (c *Cache) Store(name string, res Result, seq uint64, fetch bool, now time.Time) bool {
	e := c.m[name]
	switch {
	case e != nil && e.seq > seq:
		return false
	case e != nil && res.Absent && !fetch && e.res.Err == nil:
		if e.gone.IsZero() {
			e.gone = now
		}
		if now.Sub(e.gone) < c.grace {
			return false
		}
		e.res, e.seq, e.gone = res, seq, time.Time{}
		return true
	case e != nil:
		e.res, e.seq, e.gone = res, seq, time.Time{}
		return true
	case !fetch:
		return false
	}
	if len(c.m) >= c.max {
		for victim := range c.m {
			delete(c.m, victim)
			break
		}
	}
	c.m[name] = &entry{res: res, seq: seq}
	return true
}

// Due returns the names the next poll round reads and clears their used marks: the used
// names first, then the sweep.
func (c *Cache) Due() []string {
	c.rounds++
	var names []string
	for name, e := range c.m {
		if len(names) >= c.round {
			return names
		}
		if e.used {
			e.used, e.picked = false, c.rounds
			names = append(names, name)
		}
	}
	used := len(names)
	for name, e := range c.m {
		if len(names) >= c.round || len(names)-used >= c.sweep {
			break
		}
		if !e.used && e.picked != c.rounds {
			names = append(names, name)
		}
	}
	return names
}

// Len is the number of cached names.
func (c *Cache) Len() int { return len(c.m) }

// Clear drops every name.
func (c *Cache) Clear() { clear(c.m) }
