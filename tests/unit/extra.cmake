# MESHTRAIN_BF16_EMULATE picks the bf16 product path once per process, so each value runs in its own process.
add_test(NAME unit_bf16_emulate_env_1 COMMAND test_unit --gtest_filter=Bf16Env.*)
set_tests_properties(unit_bf16_emulate_env_1 PROPERTIES ENVIRONMENT "MESHTRAIN_BF16_EMULATE=1" TIMEOUT 300)
add_test(NAME unit_bf16_emulate_env_bad COMMAND test_unit --gtest_filter=Bf16Env.*)
set_tests_properties(unit_bf16_emulate_env_bad PROPERTIES ENVIRONMENT "MESHTRAIN_BF16_EMULATE=yes" TIMEOUT 300)
