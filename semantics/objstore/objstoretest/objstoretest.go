// Package objstoretest is the conformance suite of objstore.Bucket: the
// filesystem Dir and the S3 store (semantics/objstore/s3store, against a
// real server from internal/testkit/s3test) run the same tests.
package objstoretest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"forgeyard.dev/transport/semantics/objstore"
)

// Run runs the suite; newBucket returns an empty bucket per call.
func Run(t *testing.T, newBucket func(t *testing.T) objstore.Bucket) {
	ctx := context.Background()
	t.Run("PutGetStat", func(t *testing.T) {
		b := newBucket(t)
		data := []byte("hello, object store")
		if err := b.Put(ctx, "a/b/c", bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		got := get(t, b, "a/b/c", 0, -1)
		if !bytes.Equal(got, data) {
			t.Fatalf("got %q", got)
		}
		if got := get(t, b, "a/b/c", 7, 6); string(got) != "object" {
			t.Fatalf("range got %q", got)
		}
		if got := get(t, b, "a/b/c", 7, -1); string(got) != "object store" {
			t.Fatalf("tail got %q", got)
		}
		if got := get(t, b, "a/b/c", 3, 0); len(got) != 0 {
			t.Fatalf("empty range got %q", got)
		}
		in, err := b.Stat(ctx, "a/b/c")
		if err != nil || in.Size != int64(len(data)) || in.Key != "a/b/c" || in.Modified.IsZero() {
			t.Fatalf("Stat = %+v, %v", in, err)
		}
	})
	t.Run("Replace", func(t *testing.T) {
		b := newBucket(t)
		for _, s := range []string{"first version", "second"} {
			if err := b.Put(ctx, "k", strings.NewReader(s), int64(len(s))); err != nil {
				t.Fatal(err)
			}
		}
		if got := get(t, b, "k", 0, -1); string(got) != "second" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Put(ctx, "e", strings.NewReader(""), 0); err != nil {
			t.Fatal(err)
		}
		if got := get(t, b, "e", 0, -1); len(got) != 0 {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("NotExist", func(t *testing.T) {
		b := newBucket(t)
		if _, err := b.Get(ctx, "missing/x", 0, -1); !errors.Is(err, objstore.ErrNotExist) {
			t.Fatalf("Get: %v", err)
		}
		if _, err := b.Stat(ctx, "missing/x"); !errors.Is(err, objstore.ErrNotExist) {
			t.Fatalf("Stat: %v", err)
		}
		if err := b.Delete(ctx, "missing/x"); err != nil {
			t.Fatalf("Delete of a missing object: %v", err)
		}
	})
	t.Run("ListDelete", func(t *testing.T) {
		b := newBucket(t)
		keys := []string{"p/q/2", "p/q/1", "p/r/1", "pz/1", "other/1"}
		for _, k := range keys {
			if err := b.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
				t.Fatal(err)
			}
		}
		if got := list(t, b, "p/"); strings.Join(got, " ") != "p/q/1 p/q/2 p/r/1" {
			t.Fatalf("List(p/) = %v", got)
		}
		if got := list(t, b, "p"); strings.Join(got, " ") != "p/q/1 p/q/2 p/r/1 pz/1" {
			t.Fatalf("List(p) = %v", got)
		}
		if got := list(t, b, "p/q/"); strings.Join(got, " ") != "p/q/1 p/q/2" {
			t.Fatalf("List(p/q/) = %v", got)
		}
		if got := list(t, b, "none/"); len(got) != 0 {
			t.Fatalf("List(none/) = %v", got)
		}
		if err := b.Delete(ctx, "p/q/1"); err != nil {
			t.Fatal(err)
		}
		if got := list(t, b, "p/q/"); strings.Join(got, " ") != "p/q/2" {
			t.Fatalf("after Delete, List(p/q/) = %v", got)
		}
		stop := errors.New("stop")
		n := 0
		if err := b.List(ctx, "", func(objstore.Info) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
			t.Fatalf("List stopped by fn: %v after %d", err, n)
		}
	})
	t.Run("InvalidKey", func(t *testing.T) {
		b := newBucket(t)
		for _, k := range []string{"", "/a", "a/", "a//b", "../a", "a/./b", "a b"} {
			if err := b.Put(ctx, k, strings.NewReader("x"), 1); err == nil {
				t.Errorf("Put(%q) accepted", k)
			}
		}
	})
	t.Run("Large", func(t *testing.T) {
		b := newBucket(t)
		data := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
		if err := b.Put(ctx, "big", bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		if got := get(t, b, "big", 1<<20, 1<<20); !bytes.Equal(got, data[1<<20:2<<20]) {
			t.Fatal("range of a large object differs")
		}
	})
}

func get(t *testing.T, b objstore.Bucket, key string, off, n int64) []byte {
	t.Helper()
	r, err := b.Get(context.Background(), key, off, n)
	if err != nil {
		t.Fatalf("Get(%s, %d, %d): %v", key, off, n, err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("Get(%s) read: %v", key, err)
	}
	return got
}

func list(t *testing.T, b objstore.Bucket, prefix string) []string {
	t.Helper()
	var out []string
	if err := b.List(context.Background(), prefix, func(in objstore.Info) error {
		out = append(out, in.Key)
		return nil
	}); err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return out
}
