// Transport security (issue 8): ZeroMQ CURVE keys, the list of public keys a
// process lets connect, and the files both live in.
//
// A key file (pacerctl keygen) holds one process's keypair in Z85 (40
// characters each), as `public-key = "..."` and `secret-key = "..."`
// lines; it is written with mode 0600. An allowed-keys file has one public
// key per line, optionally after a name (`NAME KEY`); lines starting with
// "# " are comments (a key itself may start with '#'):
//
//   # the cluster
//   monitor  <the monitor's public key: 40 Z85 characters>
//   shard-0  <...>
//
// The key named "monitor" is the one every process expects the monitor to
// have; a shard's key reaches workers in the shard map; keys named
// "operator" or "operator-..." may change the job through pacerctl.
#ifndef PACER_PS_BASE_SECURITY_H_
#define PACER_PS_BASE_SECURITY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pacer {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Whether this libzmq was built with CURVE (libsodium).
bool CurveAvailable();

// A fresh keypair (zmq_curve_keypair). FailedPrecondition without CURVE.
absl::StatusOr<CurveKeyPair> GenerateKeyPair();

// Whether `key` is a Z85-encoded 32-byte key (40 characters of Z85's
// alphabet).
bool IsZ85Key(const std::string& key);

// Writes `keys` to PREFIX.key (both keys, mode 0600, refused when it exists)
// and PREFIX.pub (the public key alone, as an allowed-keys line named
// `name`).
absl::Status WriteKeyFiles(const CurveKeyPair& keys, const std::string& prefix,
                           const std::string& name);

// Reads a key file; InvalidArgument naming the file and line on anything
// malformed, PermissionDenied when anyone but its owner and group may read
// it (or its group may write it).
absl::StatusOr<CurveKeyPair> ReadKeyFile(const std::string& path);

// The same from the file's text; `path` names it in errors.
absl::StatusOr<CurveKeyPair> ParseKeyFile(const std::string& text, const std::string& path);

struct AllowedKey {
  std::string name;  // may be empty
  std::string public_key;
};

// Reads an allowed-keys file; InvalidArgument naming the file and line on a
// malformed key or a name given twice.
absl::StatusOr<std::vector<AllowedKey>> ReadAllowedKeys(const std::string& path);

absl::StatusOr<std::vector<AllowedKey>> ParseAllowedKeys(const std::string& text,
                                                         const std::string& path);

// The key named `name`, or empty.
std::string FindKey(const std::vector<AllowedKey>& keys, const std::string& name);

// Whether an allowed key's name marks an operator's key: "operator", or
// "operator-" and more. Under transport security the monitor takes
// pacerctl's commands that change a job (remove-worker, shard add and drain,
// faults) only from operator keys; any allowed key may read the status.
bool IsOperatorName(const std::string& name);

}  // namespace pacer

#endif  // PACER_PS_BASE_SECURITY_H_
