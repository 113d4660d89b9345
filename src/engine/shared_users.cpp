#include "engine/shared_users.hpp"

#include "engine/context.hpp"

namespace softhca::engine {

void SharedUsers::attach() {
  here_.attach();
  context_.add_users(kind_, handle_, 1);
}

void SharedUsers::detach() {
  here_.detach();
  context_.add_users(kind_, handle_, -1);
}

bool SharedUsers::in_use() const { return here_.in_use() || context_.users_elsewhere(kind_, handle_) != 0; }

}  // namespace softhca::engine
