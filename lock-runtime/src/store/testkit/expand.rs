//! `store_contract!`: the cases as one module of tests per store.

/// Expands the contract into a module of tests, one per case:
/// `store_contract!(memory_contract, make)`, or with the cases whose
/// ability the store lacks, `store_contract!(redis_contract, make, skip:
/// [a_forced_release_is_pushed_to_the_holder, ...])`, where `make` is an
/// async fn returning a [`Clients`](crate::store::testkit::Clients). A skipped
/// case is an ignored test that checks the store indeed lacks its ability.
#[macro_export]
macro_rules! store_contract {
    ($module:ident, $make:path) => {
        $crate::store_contract!($module, $make, skip: []);
    };
    ($module:ident, $make:path, skip: [$($skip:ident),* $(,)?]) => {
        $crate::store_contract!(@module ($) $module, $make, [$($skip),*]);
    };
    (@module ($d:tt) $module:ident, $make:path, [$($skip:ident),*]) => {
        mod $module {
            use super::*;

            macro_rules! contract_case {
                $(
                    ($skip) => {
                        #[test]
                        #[ignore = "the store lacks the ability this case checks"]
                        fn $skip() {
                            $crate::store::testkit::run(async {
                                let store = $make().await;
                                let applies =
                                    $crate::store::testkit::applies(stringify!($skip), &store).await;
                                assert!(!applies);
                            });
                        }
                    };
                )*
                ($d case:ident) => {
                    #[test]
                    fn $d case() {
                        $crate::store::testkit::run(async {
                            let store = $make().await;
                            $crate::store::testkit::$d case(&store).await;
                        });
                    }
                };
            }

            contract_case!(acquire_is_exclusive);
            contract_case!(racing_clients_never_both_win);
            contract_case!(an_expired_lease_is_free_and_stale);
            contract_case!(only_the_holder_renews_or_releases);
            contract_case!(a_lingering_release_keeps_the_lease_that_long);
            contract_case!(fencing_tokens_increase_across_holders);
            contract_case!(a_watch_fires_on_release_and_only_then);
            contract_case!(a_hand_over_moves_the_lease_to_a_new_token);
            contract_case!(a_forced_release_frees_the_key_and_tells_the_holder);
            contract_case!(a_forced_release_is_pushed_to_the_holder);
            contract_case!(an_abandoned_acquire_leaves_no_lease);
            contract_case!(an_abandoned_waiter_leaves_nothing_queued);
            contract_case!(inspect_reports_the_holder);
            contract_case!(the_capabilities_are_consistent);
            contract_case!(shares_hold_together_and_an_exclusive_claim_alone);
            contract_case!(a_semaphore_admits_up_to_its_limit);
            contract_case!(each_permit_expires_renews_and_fences_alone);
            contract_case!(the_claim_rule_holds_for_every_pair);
            contract_case!(a_forced_release_frees_every_share);
            contract_case!(a_waiting_exclusive_claim_stops_new_shares);

            #[test]
            fn the_skipped_cases_are_the_missing_abilities() {
                $crate::store::testkit::run(async {
                    let store = $make().await;
                    $crate::store::testkit::the_skipped_cases_are_the_missing_abilities(
                        ::core::module_path!(),
                        &store,
                        &[$(stringify!($skip)),*],
                    )
                    .await;
                });
            }
        }
    };
}
