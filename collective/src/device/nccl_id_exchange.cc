#include "device/nccl_id_exchange.h"

#include <elasticrun/types.hpp>

namespace elasticrun::collective {

std::string nccl_id_key(const std::string& scope) { return scope + "nccl/id"; }

std::string DeviceScopes::next(std::uint64_t epoch, std::uint32_t join) {
  if (epoch != epoch_ || join != join_) {
    epoch_ = epoch;
    join_ = join;
    created_ = 0;
  }
  return "e" + std::to_string(epoch) + (join > 1 ? "." + std::to_string(join) : "") + "/d" +
         std::to_string(created_++) + "/";
}

Bytes exchange_nccl_id(Store& store, const std::string& scope, int rank, const std::function<Bytes()>& make_id,
                       Clock::time_point deadline) {
  const std::string key = nccl_id_key(scope);
  if (rank == 0) {
    Bytes id = make_id();
    if (id.size() != kNcclIdBytes)
      throw Error("nccl: unique id has " + std::to_string(id.size()) + " bytes, expected " +
                  std::to_string(kNcclIdBytes));
    store.set(key, id);
    return id;
  }
  Bytes id = store.get(key, deadline);
  if (id.size() != kNcclIdBytes)
    throw ProtocolError("nccl: value of '" + key + "' has " + std::to_string(id.size()) + " bytes, expected " +
                        std::to_string(kNcclIdBytes));
  return id;
}

IdExchange store_id_exchange(std::shared_ptr<Store> store, std::string scope, int rank) {
  return [store = std::move(store), scope = std::move(scope), rank](const std::function<Bytes()>& make_id,
                                                                      Clock::time_point deadline) {
    return exchange_nccl_id(*store, scope, rank, make_id, deadline);
  };
}

}  // namespace elasticrun::collective
