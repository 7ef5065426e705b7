package enum

import "testing"

type color uint32

const (
	red   color = 0
	green color = 1
	blue  color = 3 // 2 is not defined
)

var colorNames = [...]string{red: "Red", green: "Green", blue: "Blue"}

func (c color) String() string { return Name(colorNames[:], c, "color") }

func TestName(t *testing.T) {
	for v, want := range map[color]string{red: "Red", green: "Green", 2: "color(2)", blue: "Blue", 4: "color(4)", 1 << 31: "color(2147483648)"} {
		if got := v.String(); got != want {
			t.Errorf("%d: got %q, want %q", uint32(v), got, want)
		}
	}
	if n := testing.AllocsPerRun(20, func() { _ = blue.String() }); n != 0 {
		t.Errorf("naming a defined value allocated %.1f times", n)
	}
}
