package logs_test

import (
	"testing"

	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/logs/logstest"
	"forgeyard.dev/transport/semantics/objstore"
)

func TestFileSinkConformance(t *testing.T) {
	logstest.Run(t, func(t *testing.T) (func() logstest.Sink, bool) {
		dir := t.TempDir()
		return func() logstest.Sink {
			s, err := logs.NewFileSink(dir, logs.FileSinkOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}, false
	})
}

func TestBucketSinkConformance(t *testing.T) {
	logstest.Run(t, func(t *testing.T) (func() logstest.Sink, bool) {
		dir := t.TempDir()
		return func() logstest.Sink {
			b, err := objstore.NewDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			s, err := logs.NewBucketSink(logs.BucketSinkConfig{Bucket: b, Prefix: "logs/"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, true
	})
}
