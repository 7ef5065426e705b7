package capacity

import "math"

// PostgreSQL on-disk sizes, from the storage layout (PostgreSQL docs,
// "Database Page Layout"): an 8 KiB page with a 24-byte header; per heap
// row a 4-byte line pointer and a 23-byte tuple header (24 with
// alignment; the authority's columns are all NOT NULL, so no null
// bitmap), then the columns at their alignment, the tuple padded to 8.
// A short bytea/text (≤ 126 bytes) has a 1-byte header and no alignment;
// a longer one a 4-byte header at 4-byte alignment. A B-tree leaf entry is
// an 8-byte index tuple header, the key, padding to 8, and a line
// pointer; leaves are filled to the given fraction (90 % for keys that
// arrive in order, such as ULIDs; ~70 % for keys that arrive at random).
// Dead row versions left by updates until VACUUM are not counted.

type pgCol struct {
	size  float64 // data bytes
	align float64
	varl  bool
}

var (
	idCol   = bytesCol(16) // a ULID as BYTEA
	i8      = pgCol{size: 8, align: 8}
	boolCol = pgCol{size: 1, align: 1}
)

func bytesCol(n float64) pgCol { return pgCol{size: n, varl: true} }
func textCol(n float64) pgCol  { return pgCol{size: n, varl: true} }

func pgData(start float64, cols []pgCol) float64 {
	off := start
	for _, c := range cols {
		size, align := c.size, c.align
		if c.varl {
			if size <= 126 {
				size, align = size+1, 1
			} else {
				size, align = size+4, 4
			}
		}
		off = math.Ceil(off/align)*align + size
	}
	return math.Ceil(off/8) * 8
}

const pgPage, pgPageHeader = 8192.0, 24.0

// pgRow is the heap bytes one row takes, its share of the page included.
func pgRow(cols ...pgCol) float64 {
	tuple := pgData(24, cols) + 4
	perPage := math.Floor((pgPage - pgPageHeader) / tuple)
	return pgPage / perPage
}

// pgIndex is the B-tree leaf bytes of one entry at the given fill.
func pgIndex(fill float64, cols ...pgCol) float64 {
	entry := pgData(8, cols) + 4
	perPage := math.Floor((pgPage - pgPageHeader - 16) * fill / entry) // 16: the B-tree special space
	return pgPage / perPage
}
