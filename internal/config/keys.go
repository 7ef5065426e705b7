package config

import (
	"reflect"
	"strings"
)

// Keys returns the dotted TOML key of every leaf of t, a configuration
// struct such as Daemon: each field with a toml tag, walking into the
// structs that have tagged fields of their own (tables; a struct without
// any, such as Duration or Version, is a value). The order is the
// fields'. The tests that check the examples and the limits table walk
// the configuration with it.
func Keys(t reflect.Type) []string { return keys(t, "") }

func keys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			if sub := keys(f.Type, prefix+tag+"."); len(sub) > 0 {
				out = append(out, sub...)
				continue
			}
		}
		out = append(out, prefix+tag)
	}
	return out
}
