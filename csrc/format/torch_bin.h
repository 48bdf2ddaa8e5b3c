/* torch_bin.h — reader for PyTorch checkpoints (torch.save's zip format: pytorch_model.bin,
 * medusa_lm_head.pt) without torch and without running any pickled code.
 *
 * The file is a ZIP archive whose entries are stored, not compressed (torch aligns each entry's
 * data to 64 bytes with padding in the local header's extra field and always writes the ZIP64
 * end records):
 *   <archive>/data.pkl      a pickle (protocol 2) of the state dict
 *   <archive>/data/<key>    the raw little-endian bytes of storage <key>
 *   <archive>/version, <archive>/byteorder ("little"), ...   (only byteorder is read)
 * The pickle of a state dict {name: tensor} (an OrderedDict, with its `_metadata` attribute set
 * by BUILD) calls only
 *   collections.OrderedDict()                      the dict itself and each tensor's hooks
 *   torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 *                                   backward_hooks[, metadata])
 *   torch._utils._rebuild_parameter(tensor, requires_grad, backward_hooks)
 * and names each storage by a persistent id ('storage', torch.<T>Storage, key, location, numel)
 * with <T> one of Float, Half, BFloat16, Double, Long, Int, Short, Char, Byte, Bool.
 *
 * A small pickle machine runs exactly the opcodes those need. Any other global (os.system,
 * builtins.eval, ...), a call of anything but those callables, an object-building opcode (INST,
 * OBJ, NEWOBJ, EXT*) or an unknown opcode is refused with SD_ERR_FORMAT and a message naming it;
 * nothing is ever imported or called. The ZIP is checked as strictly: stored entries only, no
 * encryption, every entry inside the file and none overlapping another. Tensors must be
 * contiguous row-major (a dimension of size 1 may have any stride, as in PyTorch); each becomes
 * a view into its storage's entry, its extent checked against the entry's size. */
#ifndef SD_TORCH_BIN_H
#define SD_TORCH_BIN_H

#include "specdec.h"
#include "format/safetensors.h"

/* Open the PyTorch checkpoint `path` as a tensor set: one mapping, and the top-level dict's
 * tensors in its order, named by its keys. type_name is the safetensors name of the storage's
 * dtype ("F32", "F16", "BF16", "I64", "BOOL", ...); type is its sd_type for F32/F16/BF16 and -1
 * for the others. A tensor's data is not necessarily aligned to its element size (a ZIP written
 * by another tool need not pad). Close with sd_st_close. */
sd_status sd_torch_bin_open(sd_st_set **out, const char *path);

/* Open one weights file by its content, into the same form: a ZIP archive (torch.save's format,
 * X.bin or X.pt) with sd_torch_bin_open, anything else as a single safetensors file
 * (X.safetensors). For the loaders of heads that come in either format. */
sd_status sd_tensor_set_open_file(sd_st_set **out, const char *path);

#endif /* SD_TORCH_BIN_H */
