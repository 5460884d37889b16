/* A 64-bit word mixed into a running hash: murmur3's finalizer, so a
 * change in any bit of w reaches every bit of the result. A multiply alone
 * (FNV's per word) never carries a change in high bits down, and ids that
 * differ there (sequential ids in their last bytes, as W3C hex prints
 * them) collided. */
#ifndef OFFCPU_MIX_H
#define OFFCPU_MIX_H

static __always_inline u64 mix64(u64 h, u64 w)
{
	h ^= w;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

#endif
