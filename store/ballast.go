package store

import (
	"errors"
	"fmt"
	"os"
)

// ballastFile is the name, inside the data dir, of the file that holds
// back part of the reserve (CockroachDB keeps one too). Writes stop at the
// reserve, but another process can still fill the disk to the last byte;
// then the ballast is deleted so that Pebble has room to finish a flush,
// to close, and to replay its log at the next start. It is made again
// once free space is back above the reserve plus its size.
const ballastFile = "ballast"

// ballast is that file. Only the health monitor (and Open, before the
// monitor runs) touches it.
type ballast struct {
	path string
	size uint64 // 0: no ballast
	have bool
}

// newBallast notes whether a ballast of the right size is there already;
// one of another size (the reserve changed) is replaced.
func newBallast(path string, size uint64) *ballast {
	b := &ballast{path: path, size: size}
	if size == 0 {
		_ = os.Remove(path)
		return b
	}
	if fi, err := os.Stat(path); err == nil {
		if uint64(fi.Size()) == size {
			b.have = true
		} else {
			_ = os.Remove(path)
		}
	}
	return b
}

func (b *ballast) held() bool { return b.have }

// take writes the ballast: allocated blocks, not a sparse file, so that
// it really holds the space.
func (b *ballast) take() error {
	tmp := b.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("store: ballast: %w", err)
	}
	err = allocate(f, int64(b.size))
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, b.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("store: ballast: %w", err)
	}
	b.have = true
	return nil
}

// release deletes the ballast.
func (b *ballast) release() error {
	if err := os.Remove(b.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("store: ballast: %w", err)
	}
	b.have = false
	return nil
}

// writeZeros fills f with size zero bytes, where blocks cannot be
// allocated without writing.
func writeZeros(f *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for size > 0 {
		n := int64(len(buf))
		if size < n {
			n = size
		}
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}
