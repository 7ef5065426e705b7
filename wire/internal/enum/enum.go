// Package enum names the values of the wire's Postcard enums, so that every
// enum's String reads the same: its variant's name, or "Type(n)" for a
// value this build does not define (a newer peer's variant, a corrupt
// value). It is wire's own (no promise).
package enum

import "strconv"

// Name returns names[v], or typ+"(v)" when v is beyond names or names[v]
// is empty. names is the enum's table indexed by discriminant, e.g.
//
//	var phaseNames = [...]string{PhasePreparing: "Preparing", PhaseRunning: "Running"}
//
//	func (p AttemptPhase) String() string { return enum.Name(phaseNames[:], p, "AttemptPhase") }
//
// Naming a defined value allocates nothing.
func Name[E ~uint8 | ~uint16 | ~uint32 | ~uint64](names []string, v E, typ string) string {
	if uint64(v) < uint64(len(names)) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.FormatUint(uint64(v), 10) + ")"
}
