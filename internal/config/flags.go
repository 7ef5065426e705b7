package config

import "flag"

// SetFlags names the flags given on a command line: a set flag overrides
// the configuration file's key, an unset one leaves it alone.
type SetFlags map[string]bool

// FlagsSet returns the flags of fs that were set (fs must be parsed).
func FlagsSet(fs *flag.FlagSet) SetFlags {
	set := SetFlags{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	return set
}

// String stores v in *dst when the flag name was set.
func (s SetFlags) String(name string, dst *string, v string) {
	if s[name] {
		*dst = v
	}
}
