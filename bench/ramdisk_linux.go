package bench

import "syscall"

// onRAMDisk reports whether dir is on tmpfs or ramfs, where a sync costs
// nothing.
func onRAMDisk(dir string) bool {
	const tmpfsMagic, ramfsMagic = 0x01021994, 0x858458f6
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return false
	}
	return st.Type == tmpfsMagic || st.Type == ramfsMagic
}
