//go:build race

package store

// raceEnabled: the race detector instruments modernc's transpiled SQLite as
// well, which makes it some twenty times slower.
const raceEnabled = true
